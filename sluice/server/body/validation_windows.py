"""Pydantic validation of a large body, a window of list elements at a time.

`validate(model, data)` returns what `openai_protocol.validate_body(data, model)`
returns (the same model, or a 400 for the same first error), but no pydantic
call validates more than about one window of elements: pydantic's core holds
the GIL for a whole call, and one call over a prompt of 2M token ids took 1.6 s
(messages cost ~3 us each, ids ~0.4 us).

Only the lists in `WINDOWED_LISTS` are cut: lists whose elements are validated
one by one, nothing but `min_length=1` looking at the whole list (the prompt's
shape check, which does, runs on the whole list here first; pydantic then
runs it on each window, which passes too). Each window is validated as the
body itself with that list replaced by the window, so a union picks the same
branch for it as for the whole list and errors keep their form; an error's
element index is moved back by the window's offset. One element with a long
list of its own (a message's content parts, one long prompt in a batch) is cut
the same way one level down.

Which error is reported: pydantic lists errors field by field in definition
order and a list's element by element, and the first one is reported. So an
error in a field before the cut list wins, then the first window with an error
in the list, then an error in a field after it (found in the first window:
every window carries the same other fields).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from sluice.apis import openai_protocol
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.completions import protocol as completions_protocol
from sluice.server.http.errors import validation_error

Body = TypeVar("Body", bound=openai_protocol.OpenAIModel)
ErrorDetails = dict[str, Any]


@dataclass(frozen=True, slots=True)
class WindowedList:
    """A list field of a body that may be validated a window at a time."""

    name: str
    # Elements (or inner elements) per window: ~1-2 ms of pydantic each.
    window_items: int
    # Checks the whole list before the elements (pydantic's before-validator).
    shape_check: Callable[[list], bool] | None = None
    # An element's own list that may be long too: a key of the element (a
    # message's "content"), or "" for an element that is a list itself.
    inner: str | None = None
    # The model of an element with an `inner` key: its fields' order.
    element_model: type[openai_protocol.OpenAIModel] | None = None


WINDOWED_LISTS: dict[type[openai_protocol.OpenAIModel], WindowedList] = {
    completions_protocol.CompletionRequest: WindowedList(
        "prompt", 4096, shape_check=completions_protocol.is_prompt_list, inner=""
    ),
    chat_protocol.ChatCompletionRequest: WindowedList(
        "messages", 256, inner="content", element_model=chat_protocol.ChatMessage
    ),
    chat_protocol.TokenizeRequest: WindowedList(
        "messages", 256, inner="content", element_model=chat_protocol.ChatMessage
    ),
    chat_protocol.DetokenizeRequest: WindowedList("tokens", 8192),
}


@dataclass(frozen=True, slots=True)
class _Window:
    """Elements [start, stop) of the list; or, with `inner_start` set, the inner
    list items [inner_start, inner_stop) of element `start` alone."""

    start: int
    stop: int
    inner_start: int | None = None
    inner_stop: int = 0
    # The last inner window of its element: the element is whole after it.
    is_last_inner: bool = False


def validate(model: type[Body], data: dict[str, Any]) -> Body:
    """`model` validated from `data` a window at a time; InvalidRequestError (400)."""
    windowed = WINDOWED_LISTS.get(model)
    items = data.get(windowed.name) if windowed is not None else None
    if (
        windowed is None
        or not isinstance(items, list)
        or not _weighs_more(items, windowed.inner, windowed.window_items)
        or (windowed.shape_check is not None and not windowed.shape_check(items))
    ):
        return openai_protocol.validate_body(data, model)
    return _WindowedValidation(model, data, windowed, items).run()


def _weighs_more(items: list, inner: str | None, budget: int) -> bool:
    """Whether `items` weigh more than `budget` (looking no further than that)."""
    if len(items) > budget:
        return True
    return sum(_weight(item, inner) for item in items) > budget


def _weight(item: Any, inner: str | None) -> int:
    """Pydantic's work for one element, in inner items: 1 + its own list's length."""
    nested = _inner_list(item, inner)
    return 1 if nested is None else 1 + len(nested)


def _inner_list(item: Any, inner: str | None) -> list | None:
    if inner is None:
        return None
    nested = item if inner == "" else item.get(inner) if isinstance(item, dict) else None
    return nested if isinstance(nested, list) else None


class _WindowedValidation:
    def __init__(
        self,
        model: type[openai_protocol.OpenAIModel],
        data: dict[str, Any],
        windowed: WindowedList,
        items: list,
    ):
        self.model = model
        self.data = data
        self.windowed = windowed
        self.items = items
        field_names = list(model.model_fields)
        self.field_index = field_names.index(windowed.name)
        self.field_order = {name: index for index, name in enumerate(field_names)}

    def run(self) -> Any:
        first: Any = None
        later_error: ErrorDetails | None = None
        values: list = []
        # The element being assembled from inner windows, and its inner items.
        inner_element: Any = None
        inner_values: list = []
        for window in self._windows():
            try:
                validated = self.model.model_validate(self._data_for(window))
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                before, own, after = self._split(errors)
                # Every window has the same other fields: errors before the
                # list show in the first window, or in none.
                if before:
                    raise validation_error(before) from None
                if own and not (window.inner_start is not None and self._waits(own[0], window)):
                    raise validation_error([self._moved(own[0], window)]) from None
                later_error = later_error or (after[0] if after else None)
                continue
            if first is None:
                first = validated
            window_values = getattr(validated, self.windowed.name)
            if window.inner_start is None:
                values.extend(window_values)
                continue
            element = window_values[0]
            if window.inner_start == 0:
                inner_element, inner_values = element, []
            inner_values.extend(self._inner_of(element))
            if window.is_last_inner:
                values.append(self._with_inner(inner_element, inner_values))
        if later_error is not None:
            raise validation_error([later_error])
        assert first is not None, "a windowed list has at least one window"
        setattr(first, self.windowed.name, values)
        return first

    def _windows(self) -> Iterator[_Window]:
        """Runs of elements weighing at most a window; a heavier element alone, cut inside."""
        budget = self.windowed.window_items
        start, weight = 0, 0
        for index, item in enumerate(self.items):
            item_weight = _weight(item, self.windowed.inner)
            if item_weight > budget:
                if start < index:
                    yield _Window(start, index)
                num_inner = item_weight - 1
                for inner_start in range(0, num_inner, budget):
                    inner_stop = min(num_inner, inner_start + budget)
                    yield _Window(
                        index, index + 1, inner_start, inner_stop, inner_stop == num_inner
                    )
                start, weight = index + 1, 0
                continue
            if weight + item_weight > budget:
                yield _Window(start, index)
                start, weight = index, 0
            weight += item_weight
        if start < len(self.items):
            yield _Window(start, len(self.items))

    def _data_for(self, window: _Window) -> dict[str, Any]:
        if window.inner_start is None:
            part = self.items[window.start : window.stop]
        else:
            item = self.items[window.start]
            inner = _inner_list(item, self.windowed.inner)
            piece = inner[window.inner_start : window.inner_stop]  # type: ignore[index]
            part = [piece if self.windowed.inner == "" else {**item, self.windowed.inner: piece}]
        return {**self.data, self.windowed.name: part}

    def _inner_of(self, element: Any) -> list:
        if self.windowed.inner == "":
            return element
        return getattr(element, self.windowed.inner)

    def _with_inner(self, element: Any, inner_values: list) -> Any:
        if self.windowed.inner == "":
            return inner_values
        setattr(element, self.windowed.inner, inner_values)
        return element

    def _split(
        self, errors: list[ErrorDetails]
    ) -> tuple[list[ErrorDetails], list[ErrorDetails], list[ErrorDetails]]:
        """Errors of fields before the windowed list, of the list, and after it."""
        before, own, after = [], [], []
        for error in errors:
            location = error.get("loc", ())
            index = self.field_order.get(location[0], -1) if location else -1
            if index == self.field_index:
                own.append(error)
            else:
                (before if index < self.field_index else after).append(error)
        return before, own, after

    def _waits(self, error: ErrorDetails, window: _Window) -> bool:
        """Whether an inner window's first error, in a field of its element after the
        inner list (a message's name, after its content), must wait: an error in
        a later inner window of the same element comes first. The last inner
        window of the element still has it if none did."""
        element_model = self.windowed.element_model
        location = error.get("loc", ())
        if window.is_last_inner or element_model is None or len(location) < 3:
            return False
        element_fields = list(element_model.model_fields)
        field = location[2]
        return field in element_fields and element_fields.index(field) > element_fields.index(
            self.windowed.inner
        )

    def _moved(self, error: ErrorDetails, window: _Window) -> ErrorDetails:
        """`error` with its element index (and inner index) as in the whole list."""
        location = list(error["loc"])
        ints = [position for position, part in enumerate(location) if isinstance(part, int)]
        if ints:
            location[ints[0]] += window.start
        if window.inner_start is not None and len(ints) > 1:
            location[ints[1]] += window.inner_start
        return {**error, "loc": tuple(location)}
