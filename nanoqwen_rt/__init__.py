"""nanoqwen_rt"""
