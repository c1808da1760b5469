"""`sluice audit`: check any OpenAI-compatible server for broken streams (the
rules of STREAMING_CONTRACT.md), and measure it. It speaks HTTP only and
imports nothing else of sluice, so it audits vLLM, SGLang, llama.cpp and
hosted APIs as well as sluice itself.

    sluice.audit.cli.main(argv) -> exit status        the CLI
    sluice.audit.runner.run_audit(targets, options)   the audit as a coroutine, for tests and tools

Nothing is imported here: import from the module that defines a name.
"""
