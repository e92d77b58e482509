"""What this host offers (hardware: GPUs, their memory, installed optional packages), found without importing torch.
The lowest layer beside protocol/ and auth/: methods, config, planning, jobs and the worker all ask it."""
