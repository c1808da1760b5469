"""The request in flight: its one `RequestContext` (request_context.py: id,
access log, key lease, trace, deadline, observers, the one count of delivered
tokens), built once by the middleware, and its admission (admission.py: the
queue bound and the queue timeout). Imports nothing of its package."""
