"""SSE frames as bytes: each event encoded once per process, finished turns kept whole.

A turn's log never changes once its terminal event is written, so the frames of a finished turn are
cached (least recently used, bounded in bytes) and a replay is one write of ``frames[after:]``
instead of a store read, a model per event and a send per event. Live events are encoded once,
however many watchers receive them.
"""

from __future__ import annotations

from collections import OrderedDict

from fleet_kernel.events import Event

ENCODED_KEEP = 20_000
FINISHED_MAX_BYTES = 64 * 1024 * 1024


def _encode(event: Event) -> bytes:
    # The envelope's JSON is one line (newlines inside strings are escaped), so one data: line suffices.
    return f"id: {event.seq}\nevent: {event.type}\ndata: {event.to_json()}\n\n".encode()


class FrameCache:
    def __init__(self, keep: int = ENCODED_KEEP, max_bytes: int = FINISHED_MAX_BYTES) -> None:
        self._encoded: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._keep = keep
        self._finished: OrderedDict[str, list[bytes]] = OrderedDict()
        self._finished_bytes = 0
        self._max_bytes = max_bytes

    def encode(self, event: Event) -> bytes:
        key = (event.turn_id, event.seq)
        frame = self._encoded.get(key)
        if frame is None:
            frame = self._encoded[key] = _encode(event)
            if len(self._encoded) > self._keep:
                self._encoded.popitem(last=False)
        return frame

    def finished(self, turn_id: str) -> list[bytes] | None:
        """Every frame of a finished turn (index ``i`` holds seq ``i + 1``), if cached."""
        frames = self._finished.get(turn_id)
        if frames is not None:
            self._finished.move_to_end(turn_id)
        return frames

    def keep_finished(self, events: list[Event]) -> list[bytes] | None:
        """Cache a whole turn's log; only a complete one (seq 1..n, ending with its terminal event)."""
        if not events or not events[-1].terminal or [e.seq for e in events] != list(range(1, len(events) + 1)):
            return None
        frames = [self.encode(e) for e in events]
        size = sum(map(len, frames))
        if size > self._max_bytes:
            return frames
        self._finished[events[0].turn_id] = frames
        self._finished_bytes += size
        while self._finished_bytes > self._max_bytes:
            _, dropped = self._finished.popitem(last=False)
            self._finished_bytes -= sum(map(len, dropped))
        return frames

    def forget(self, turn_ids: list[str]) -> None:
        """Drop deleted turns."""
        for turn_id in turn_ids:
            frames = self._finished.pop(turn_id, None)
            if frames is not None:
                self._finished_bytes -= sum(map(len, frames))
