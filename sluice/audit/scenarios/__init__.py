"""The audit's scenarios, by name. Each is `async (ScenarioContext) -> ScenarioResult`:
it sends its requests through the context's client and returns the exchanges
(checked afterwards by the runner) with any scenario-level findings. They are
listed by name in `registry.SCENARIOS`. Nothing is imported here: import from
the module that defines a name.
"""
