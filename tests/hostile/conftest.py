"""The hostile-client tier runs the real proxy as the e2e tier does, with its fixtures."""

from tests.e2e.conftest import proxy_factory, short_bounds_proxy

__all__ = ["proxy_factory", "short_bounds_proxy"]
