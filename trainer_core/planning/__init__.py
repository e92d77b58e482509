"""What the New run form works out before a run starts, without loading a model: what a model is from its files
(model_info, modality) and the memory estimate (memory, ray_memory). The host's devices and a run's processes are
trainer_core.host's; the data preview is trainer_core.data.preview.
"""
