"""Parts of the batched sampler; `sluice.engine.sampler` is the entry point."""
