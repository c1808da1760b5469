"""`sluice audit`: check any OpenAI-compatible server for broken streams (the
rules of STREAMING_CONTRACT.md), and measure it. It speaks HTTP only and
imports nothing else of sluice, so it audits vLLM, SGLang, llama.cpp and
hosted APIs as well as sluice itself.

    main(argv) -> exit status      the CLI (sluice.audit.cli)
    run_audit(targets, options)    the audit as a coroutine, for tests and tools
"""

from sluice.audit.cli import main
from sluice.audit.options import AuditOptions, Sizes
from sluice.audit.records import AuditResult, Finding, Target
from sluice.audit.runner import run_audit

__all__ = ["AuditOptions", "AuditResult", "Finding", "Sizes", "Target", "main", "run_audit"]
