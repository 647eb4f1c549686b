"""The two names `sglang.utils` imports from IPython.display; never called by the tests."""

from __future__ import annotations

from typing import Any


class HTML:
    def __init__(self, data: Any = None) -> None:
        self.data = data


def display(*objs: Any, **kwargs: Any) -> None:
    return None
