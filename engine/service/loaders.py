"""What the engine process runs, named by import path so that a spawned process can be given it: the loader that
builds an engine, the lister that fills the model picker, and their defaults. Tests name a scripted engine or
tiny models here instead."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Factory:
    """A callable named by import path, with keyword arguments: what a spawned process can be given."""

    path: str  # "package.module:function"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Called once in the child before its first job, with no arguments: heavy imports that the first call
    # needs anyway then run while the GUI is still starting.
    warm: str | None = None

    def resolve(self) -> Callable[..., Any]:
        fn = _named(self.path)
        return lambda *args, **kw: fn(*args, **self.kwargs, **kw)

    def warm_up(self) -> None:
        if self.warm is not None:
            _named(self.warm)()


def _named(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


DEFAULT_LOADER = Factory("engine.service.loaders:default_loader", warm="engine.service.loaders:warm_engine")
DEFAULT_LISTER = Factory("engine.service.loaders:default_lister")


def default_loader(target: str | None, draft: str | None, device: str | None, progress: Progress,
                   cancelled: Callable[[], bool], context: int | None = None) -> Any:
    """Provision the embedded pair when no target is given, make sure of the CPU kernels (a compile, the first
    time, with its elapsed time shown), then load_engine. Without kernels every later stage repeats the sentence
    that says so, and the engine carries it (`kernels_notice`) for the window's status line."""
    from engine.io.loading import check_paths, load_engine
    from engine.cpu import ext

    if target is not None:
        check_paths(target, draft)  # before the kernels, whose first compile takes minutes
    if target is None:
        from engine.io.provision import default_pair

        target_dir, draft_dir = default_pair(progress, cancelled)
        target, draft = str(target_dir), str(draft_dir)
    ext.load(progress, cancelled)
    notice = ext.notice()
    shown = (lambda stage, fraction: progress(f"{stage}\n{notice}", fraction)) if notice else progress
    engine = load_engine(target, draft, device=device, progress=shown, context=context)
    engine.kernels_notice = notice if getattr(engine, "weights_format", None) else ""
    return engine


def warm_engine() -> None:
    """Import torch and the engine and load the compiled kernels when they are built (~1.3 s): what every load
    starts with. A compile waits for the load, whose progress the window shows."""
    import engine.io.loading  # noqa: F401 - torch and the engine, imported for their side of the warm-up
    from engine.cpu import ext

    ext.find()


def default_lister() -> list[Any]:
    from engine.io.hub import list_local_models

    return list_local_models(include_unrunnable=True)  # the picker greys out a refused one and says why
