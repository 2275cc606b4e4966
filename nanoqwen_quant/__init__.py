"""nanoqwen_quant"""
