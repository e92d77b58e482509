"""What the New run form works out before a run starts, without loading a model: the host's devices (hardware), what a
model is from its files (model_info, modality), the memory estimate (memory), processes and batches (parallel) and
the data preview (preview).
"""
