-- Free a lease and replace the reserved tokens with the used ones (see gateway/store/base.py).
-- KEYS: three per scope, in order: tokens hash, daily hash, leases zset.
-- ARGV: window_s, lease_id, second, day, delta (used - reserved tokens).
-- A bucket that has left the window, or a counter that expired, is not recreated: it no
-- longer limits anything. Counters never go below zero.

local window, lease_id, second, day, delta = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local sec = tonumber(redis.call('TIME')[1])

local function adjust(key, field)
    if delta == 0 or redis.call('HEXISTS', key, field) == 0 then return end
    if redis.call('HINCRBY', key, field, delta) < 0 then redis.call('HSET', key, field, 0) end
end

for i = 1, #KEYS, 3 do
    if tonumber(second) > sec - window then adjust(KEYS[i], second) end
    adjust(KEYS[i + 1], day)
    redis.call('ZREM', KEYS[i + 2], lease_id)
end
return 1
