"""Loading a model inside hfexport's own commands without transformers' per-weight progress bar ("Loading weights
100%|...|"), which says nothing a user can act on and floods logs; the user's own calls keep their setting."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_loading_bar() -> Iterator[None]:
    """Within the body, transformers' progress bars are off (unless ``hfexport --verbose``); the previous setting
    comes back after."""
    from transformers.utils import logging

    from hfexport.commands import verbose

    if verbose():
        yield
        return

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
