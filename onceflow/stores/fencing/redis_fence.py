"""Guarded writes on Redis: check the epochs and write the rows in one Lua script.

Redis runs a script atomically, so no new owner's taking of a partition can
fall between the check and the write (``onceflow.stores.fencing``). Taking is
a script too: INCR the pipeline's counter, then GET and SET each partition's
epoch, answering the old ones.
The script takes the epoch keys first in KEYS with their expected values in
ARGV, then the rows; it answers 0 when written, else ``[i, stored]`` for the
first epoch that differs (nothing is written then). The rows go out as MSET
(or SET PX, or HSET into one hash) in chunks of 1,000, under Lua's limit on
``unpack``. One node only: on a cluster the epoch and row keys would live in
different slots, which a script cannot reach. With replicas to wait for, the
script and a WAIT go out as one pipeline (``onceflow.stores.redis_durability``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import redis

from onceflow.shared_types import TopicPartition
from onceflow.stores.fencing import COUNTER, Fenced, Guard, Taken, epoch_key, first_mismatch
from onceflow.stores.redis_durability import ReplicaWait

Mode = Literal["mset", "px", "hset"]

GUARDED_WRITE = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local stored = redis.call('GET', KEYS[i])
  if stored ~= ARGV[i + 1] then
    return {i, stored}
  end
end
local mode, px, first = ARGV[n + 2], ARGV[n + 3], n + 4
local args = {}
local function flush(command)
  if #args > 0 then
    redis.call(command, unpack(args))
    args = {}
  end
end
if mode == 'hset' then
  for i = first, #ARGV, 2 do
    args[#args + 1] = ARGV[i]
    args[#args + 1] = ARGV[i + 1]
    if #args == 2000 then
      table.insert(args, 1, KEYS[n + 1])
      flush('HSET')
    end
  end
  if #args > 0 then
    table.insert(args, 1, KEYS[n + 1])
    flush('HSET')
  end
  return 0
end
for i = n + 1, #KEYS do
  local value = ARGV[first + i - n - 1]
  if mode == 'px' then
    redis.call('SET', KEYS[i], value, 'PX', px)
  else
    args[#args + 1] = KEYS[i]
    args[#args + 1] = value
    if #args == 2000 then
      flush('MSET')
    end
  end
end
flush('MSET')
return 0
"""


# KEYS: the counter, then the partitions' epoch keys; ARGV[1]: the floor (the
# counters of the pipeline's other stores). Epochs taken under the
# per-partition scheme of earlier versions may exceed the counter: the new
# epoch then skips above them, so a partition's epoch only ever grows.
TAKE = """
local epoch = redis.call('INCR', KEYS[1])
if tonumber(ARGV[1]) >= epoch then
  epoch = tonumber(ARGV[1]) + 1
end
local old = {}
for i = 2, #KEYS do
  old[i - 1] = redis.call('GET', KEYS[i]) or false
  if old[i - 1] and tonumber(old[i - 1]) >= epoch then
    epoch = tonumber(old[i - 1]) + 1
  end
end
redis.call('SET', KEYS[1], epoch)
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], epoch)
end
return {epoch, old}
"""


class RedisFence:
    """Epochs and guarded writes under ``<base>:epoch:<topic>|<partition>``."""

    def __init__(self, client: redis.Redis, base: str, acks: ReplicaWait | None = None):
        self._client = client
        self._base = base
        self._acks = acks or ReplicaWait()
        self._script = client.register_script(GUARDED_WRITE)
        self._take = client.register_script(TAKE)

    def take(self, partitions: Sequence[TopicPartition], floor: int = 0) -> Taken:
        """One new epoch above ``floor`` for every partition, and their previous epochs
        (one script)."""
        if not partitions:
            return Taken(0, {})
        keys = [f"{self._base}:{COUNTER}", *(epoch_key(self._base, tp) for tp in partitions)]
        epoch, old = cast(list[Any], self._take(keys=keys, args=[floor]))
        return Taken(int(epoch), {tp: None if value is None else int(value)
                                  for tp, value in zip(partitions, old, strict=True)})

    def write(self, guard: Guard, mode: Mode, rows: Mapping[str, bytes], *, px: int = 0,
              hash_key: str = "") -> None:
        """Write ``rows`` (key or hash field -> value) if every epoch of ``guard`` is the
        store's; raise ``Fenced`` (nothing written) otherwise, ``ReplicasBehind`` when too
        few replicas acknowledged the rows."""
        order = sorted(guard)
        keys = [epoch_key(self._base, tp) for tp in order]
        args: list[str | bytes | int] = [len(order), *(str(guard[tp]) for tp in order), mode, px]
        if mode == "hset":
            keys.append(hash_key)
            for field, value in rows.items():
                args += [field, value]
        else:
            keys += list(rows)
            args += list(rows.values())
        if rows and self._acks.replicas:
            answer = self._acks.execute(
                self._client, lambda pipe: self._script(keys=keys, args=args, client=pipe))[0]
        else:
            answer = self._script(keys=keys, args=args)
        if answer != 0:
            index, stored = cast(list[int | bytes | None], answer)
            tp = order[int(cast(int, index)) - 1]
            mismatch = first_mismatch({tp: guard[tp]},
                                      {tp: None if stored is None else int(cast(bytes, stored))})
            raise mismatch or Fenced(tp, guard[tp], None)
