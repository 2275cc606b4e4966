"""nanoqwen_quant: Hugging Face checkpoint → .nanoqwen, and checking the result.

* quantize.py  INT4 layout-1 quantizer (spec §9.3): numpy reference + numba fast path, bit-identical; dequantize; snr_db
* cast.py      numba bf16→f32 and f32/bf16→f16 casts used when streaming a checkpoint (bit-exact vs numpy)
* hf.py        checkpoint reading: local dir or hub id, config.json → ModelConfig (with refusals), safetensors
               (single / sharded via the index) located and read in row blocks
* sources/     already-quantized sources: GPTQ / AWQ directories, GGUF files (ImportedCheckpoint: exact
               dequantization for verify, lossless repack into layout 1 (symmetric sources) or layout 2
               (AWQ, asymmetric GPTQ: their zero points) where an int4 layout holds the source exactly)
* convert.py   convert_checkpoint(...) and the `nanoqwen-convert` CLI
* errstats.py  one-pass error statistics (numba) + numpy references, for verify
* verify.py    the `nanoqwen-verify` CLI: structure, checksums, tokenizer, per-tensor error vs the source
* entry.py     the two console scripts' entry points (their imports under a Ctrl-C handler)

Public API: `from nanoqwen_quant.convert import convert_checkpoint`,
`from nanoqwen_quant.quantize import quantize, dequantize, quantize_reference`.
"""
