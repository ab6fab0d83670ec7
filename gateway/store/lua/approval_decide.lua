-- Decide a pending approval, once. KEYS: records, decisions, deadlines, forget, the tenant's
-- pending set, pending keys.
-- ARGV: member, decision JSON. Returns nil (unknown or forgotten), or {won, record JSON,
-- decision JSON or '', status} as approval_get does, `won` 1 if this call stored the decision.
-- A script runs alone: of two decisions, the second finds the first's.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local member = ARGV[1]

local forget = redis.call('ZSCORE', KEYS[4], member)
if not forget or tonumber(forget) <= now then return nil end
local record = redis.call('HGET', KEYS[1], member)
if not record then return nil end
local decision = redis.call('HGET', KEYS[2], member)
if decision then return {0, record, decision, 'decided'} end
if tonumber(redis.call('ZSCORE', KEYS[3], member)) <= now then return {0, record, '', 'expired'} end

redis.call('HSET', KEYS[2], member, ARGV[2])
redis.call('ZREM', KEYS[5], member)  -- decided: no longer counted against the caps
redis.call('HDEL', KEYS[6], member)
-- Kept as long as the record it belongs to (a key without a TTL yet gets one).
local forget_ms = math.ceil(tonumber(forget) * 1000)
if redis.call('PTTL', KEYS[2]) == -1 then
    redis.call('PEXPIREAT', KEYS[2], forget_ms)
else
    redis.call('PEXPIREAT', KEYS[2], forget_ms, 'GT')
end
return {1, record, ARGV[2], 'decided'}
