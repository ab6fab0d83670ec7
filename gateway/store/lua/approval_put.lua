-- Create an approval, after forgetting a batch of approvals whose retention has passed.
-- KEYS: records, decisions, deadlines, forget, order, the tenant's index, the tenant's pending set,
-- pending keys.
-- ARGV: member, record JSON, requested_at, expires_at, forget_at, forget_ms, tenant index base,
-- purge batch, per-key cap, per-tenant cap (0, 0: none), the key id, pending set base. Returns 1 if stored, 0 if the
-- member is already live (a retried put changes nothing, so it cannot reset a decided approval) or
-- its retention has already passed, -1 (-2) if the key (the tenant) has as many approvals pending
-- as its cap allows.
-- A member is `<tenant>:<id>`, both percent-encoded: its tenant index is the base plus the part
-- before the colon (same hash tag, so the same slot as every declared key).

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local member = ARGV[1]

-- Whole seconds bound the purge: a Lua number passed to Redis keeps only 14 digits.
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', t[1], 'LIMIT', 0, tonumber(ARGV[8]))
for _, old in ipairs(gone) do
    redis.call('HDEL', KEYS[1], old)
    redis.call('HDEL', KEYS[2], old, old .. '#redeemed')
    redis.call('ZREM', KEYS[3], old)
    redis.call('ZREM', KEYS[4], old)
    redis.call('ZREM', KEYS[5], old)
    redis.call('ZREM', ARGV[7] .. string.match(old, '^[^:]*'), old)
    redis.call('ZREM', ARGV[12] .. string.match(old, '^[^:]*'), old)
    redis.call('HDEL', KEYS[8], old)
end

local live = redis.call('ZSCORE', KEYS[4], member)
if live and tonumber(live) > now then return 0 end
if tonumber(ARGV[5]) <= now then return 0 end

-- Pending: undecided (decide takes it out of the set), and its expires_at not passed (lapsed
-- ones are taken out here). The set holds at most the tenant's cap, so this is bounded by the
-- cap, not by the approvals kept for the audit trail.
local at = string.format('%.6f', now)  -- all of now's digits (tostring keeps 14)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', at)) do
    redis.call('ZREM', KEYS[7], old)
    redis.call('HDEL', KEYS[8], old)
end
local per_key, per_tenant = tonumber(ARGV[9]), tonumber(ARGV[10])
if per_tenant > 0 then
    local pending = redis.call('ZRANGE', KEYS[7], 0, -1)
    local mine = 0
    if #pending > 0 then
        for _, key_id in ipairs(redis.call('HMGET', KEYS[8], unpack(pending))) do
            if key_id == ARGV[11] then mine = mine + 1 end
        end
    end
    if mine >= per_key then return -1 end
    if #pending >= per_tenant then return -2 end
end

redis.call('HSET', KEYS[1], member, ARGV[2])
redis.call('HDEL', KEYS[2], member, member .. '#redeemed')
redis.call('ZADD', KEYS[3], ARGV[4], member)
redis.call('ZADD', KEYS[4], ARGV[5], member)
redis.call('ZADD', KEYS[5], ARGV[3], member)
redis.call('ZADD', KEYS[6], ARGV[3], member)
redis.call('ZADD', KEYS[7], ARGV[4], member)
redis.call('HSET', KEYS[8], member, ARGV[11])
-- Each key lives until the last approval it holds is forgotten (a key without a TTL yet gets one).
for _, name in ipairs({KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]}) do
    if redis.call('PTTL', name) == -1 then
        redis.call('PEXPIREAT', name, ARGV[6])
    else
        redis.call('PEXPIREAT', name, ARGV[6], 'GT')
    end
end
return 1
