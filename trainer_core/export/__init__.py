"""Export: a run's model as a zipped adapter, merged 16-bit safetensors, GGUF (llama.cpp's own converter),
an Ollama Modelfile and a model card, optionally pushed to the hub and verified by reloading it.

Pure modules (no ML stack): ``spec`` (the job's typed spec), ``tools`` (where the converter and the quantizer
are), ``chat_templates`` (chat template family -> Ollama TEMPLATE), ``card`` (the model card). The work itself
is the worker entry point ``trainer_core.worker.export``.
"""
