"""How far behind a consumer is on an input partition, in time: when the oldest message it has not read
arrived, estimated from how the partition's end moved (pure: time comes in as an argument).

A message count says little on its own: 10,000 messages behind is a second at 10,000 msg/s and hours at
1 msg/s. The consumer samples its position and the partition's high watermark every few seconds (the
watermark its last fetch reported, no request of its own); each sample where the end moved is a mark
(when, end). The oldest unread message, at the position, arrived between the last mark whose end had not
reached it and the first whose end had: linearly between the two. Without a mark before it (the consumer
was already behind at its first sample) the first mark's time stands: the age is then a lower bound. No
message timestamp is read, so the producers' clocks play no part.
"""

from __future__ import annotations

import collections

MAX_MARKS = 720  # an hour of samples every 5 s while behind; past that, marks further from the position thin out


class PartitionLag:
    """One input partition's marks, and when the oldest message the consumer has not read arrived."""

    def __init__(self) -> None:
        self.marks: collections.deque[tuple[float, int]] = collections.deque()
        # when (by the samples' clock) the oldest unread message arrived; None when none is unread. A float
        # the metrics' thread reads whole.
        self.arrived: float | None = None

    def sample(self, now: float, position: int, end: int) -> None:
        """The consumer's position (the offset it reads next) and the partition's end (high watermark) at
        `now`; negative when not known yet, which counts as nothing unread."""
        if position < 0 or end < 0:
            self.marks.clear()
            self.arrived = None
            return
        if self.marks and end < self.marks[-1][1]:
            self.marks.clear()  # the partition was recreated (or truncated): its offsets start again
        if not self.marks or end > self.marks[-1][1]:
            self.marks.append((now, end))
            if len(self.marks) > MAX_MARKS:
                del self.marks[len(self.marks) // 2]
        # keep one mark at or before the position (the interpolation's lower end), none older
        while len(self.marks) >= 2 and self.marks[1][1] <= position:
            self.marks.popleft()
        self.arrived = self._arrived(position)

    def _arrived(self, position: int) -> float | None:
        if not self.marks or self.marks[-1][1] <= position:
            return None  # everything up to the end is read
        first, then = self.marks[0], self.marks[1] if len(self.marks) >= 2 else None
        if first[1] > position:
            return first[0]  # behind since before the first sample: it arrived by then at the latest
        assert then is not None  # the last mark is past the position, and the first is not
        # offset `position` exists once the end is past it: at end position + 1
        share = (position + 1 - first[1]) / (then[1] - first[1])
        return first[0] + (then[0] - first[0]) * share

    def seconds(self, now: float) -> float:
        """How long ago the oldest unread message arrived (0 when none is unread)."""
        arrived = self.arrived
        return 0.0 if arrived is None else max(0.0, now - arrived)
