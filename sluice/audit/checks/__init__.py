"""The per-response checks, one module per aspect (wire, shape, usage, logprobs,
text), run on every exchange by `exchange.check_exchange`; their ids and
severities are listed in `catalogue.CHECKS`. Nothing is imported here: import
from the module that defines a name.
"""
