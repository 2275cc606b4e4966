"""nanoqwen_format"""
