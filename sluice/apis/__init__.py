"""The APIs sluice serves, each declared once (`surface.py`): paths, request
models, error shape, and whether keyed, traced and generating.

Re-exports lazily (`sluice.lazy_exports`): the modules import each other,
never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.apis.surface import API_TABLE, ApiRoute, ApiSurface, ApiTable

__all__ = ["API_TABLE", "ApiRoute", "ApiSurface", "ApiTable"]
__getattr__ = lazy_exports(
    __name__,
    {name: "sluice.apis.surface" for name in __all__},
)
