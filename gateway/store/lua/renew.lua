-- Push back the expiry of a live lease (see gateway/store/base.py).
-- KEYS: the leases zset of every scope. ARGV: lease_id, ttl_s, lease_margin_s.
-- An expired lease is not revived: its slot may already be someone else's.

local lease_id, ttl, margin = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local ms = math.ceil((ttl + margin) * 1000)

for _, key in ipairs(KEYS) do
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZADD', key, 'XX', 'CH', now + ttl, lease_id) > 0 then
        redis.call('PEXPIRE', key, ms, 'GT')
    end
end
return 1
