"""What a real engine's ``kernel`` fault is: a build, not a dial (``RealBuildParams``).

A real engine (llama.cpp, vLLM) cannot drift on some prompts and not others, nor by a chosen
amount, nor produce NaN or garbage on request: its fault is a rollout to another build. So
the simulator's ``min_prompt_tokens`` and ``magnitude`` are accepted only at the values that
mean "every prompt, the build's own size", and the simulator's other modes are refused with
a message naming the modes the engine has. This module only describes faults.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from canarystack.common.faults import FaultParams


class RealBuildParams(FaultParams):
    """Base of an engine pod's ``kernel`` fault (module docstring); a subclass names its
    ``mode`` field and the class variables below."""

    ENGINE: ClassVar[str]  # e.g. "llama.cpp"
    MODES: ClassVar[tuple[str, ...]]  # the modes the engine has
    WHAT: ClassVar[str]  # what those modes are, in a few words
    REFUSED: ClassVar[tuple[str, ...]]  # the simulator's modes it cannot build
    SIZE: ClassVar[str]  # what sets the fault's size instead of magnitude

    min_prompt_tokens: int = Field(default=0, ge=0)
    magnitude: float = Field(default=1.0, allow_inf_nan=False)

    @field_validator("mode", mode="before", check_fields=False)
    @classmethod
    def _engine_mode(cls, value: object) -> object:
        if isinstance(value, str) and value in cls.REFUSED:
            raise ValueError(
                f"mode {value!r} is a kernel mode of the simulator only (canarystack.model), "
                f"not a build of a real {cls.ENGINE}: the {cls.ENGINE} engine pod has the "
                f"modes {', '.join(cls.MODES)} ({cls.WHAT}). Run broken-kernel and "
                "benign-numerics experiments against the simulator"
            )
        return value

    @model_validator(mode="after")
    def _whole_engine(self) -> RealBuildParams:
        if self.min_prompt_tokens != 0:
            raise ValueError(
                f"min_prompt_tokens={self.min_prompt_tokens}: a {self.ENGINE} build acts on "
                "every prompt; send 0 (for gameday experiments: "
                "GAMEDAY_KERNEL_MIN_PROMPT_TOKENS=0)"
            )
        if self.magnitude != 1.0:
            raise ValueError(
                f"magnitude={self.magnitude}: a {self.ENGINE} build's drift is what it is "
                f"({self.SIZE}); send magnitude 1 or leave it out"
            )
        return self
