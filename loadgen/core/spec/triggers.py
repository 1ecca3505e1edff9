"""Trigger specs: bursts, extra sessions, cache flushes, rate changes and session-mix shifts
(docs/experiments.md#triggers)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .base import _Model
from .sessions import SessionSpec


class BurstTrigger(_Model):
    kind: Literal["burst"] = "burst"
    extra_rate_factor: float = Field(..., gt=0, description="b: the extra stream's rate is b x lambda.")
    start_s: float = Field(..., ge=0, description="When the extra stream starts.")
    duration_s: float = Field(..., gt=0, description="How long it lasts.")
    seed_offset: int = Field(0, description="Changes the extra stream's seed without touching the base stream.")

    def window(self) -> tuple[float, float]:
        return self.start_s, self.start_s + self.duration_s


class ExtraSessionsTrigger(_Model):
    kind: Literal["extra_sessions"] = "extra_sessions"
    num_sessions: int = Field(..., gt=0, description="Extra sessions, evenly spread over the duration.")
    start_s: float = Field(..., ge=0)
    duration_s: float = Field(..., gt=0)
    seed_offset: int = 0

    def window(self) -> tuple[float, float]:
        return self.start_s, self.start_s + self.duration_s


class FlushTrigger(_Model):
    kind: Literal["flush"] = "flush"
    at_s: float = Field(..., ge=0, description="Reset the prefix cache, preempting running requests.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


class RateChangeTrigger(_Model):
    kind: Literal["rate_change"] = "rate_change"
    at_s: float = Field(..., ge=0)
    arrival_rate_per_s: float = Field(..., ge=0, description="The new base rate from at_s on.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


class MixShiftTrigger(_Model):
    kind: Literal["mix_shift"] = "mix_shift"
    at_s: float = Field(..., ge=0, description="Base sessions arriving from here on take the new shape.")
    sessions: SessionSpec = Field(..., description="The shape after the shift.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


Trigger = Annotated[
    Union[BurstTrigger, ExtraSessionsTrigger, FlushTrigger, RateChangeTrigger, MixShiftTrigger],
    Field(discriminator="kind"),
]
