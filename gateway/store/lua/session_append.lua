-- Append session events above the highest stored seq, then refresh the whole session's TTL.
-- KEYS: events stream, state, lease. ARGV: ttl_ms, then two per event: seq, payload.
-- Returns how many events were added. An event not above the last one (stored or just added)
-- is skipped: a retried flush must not duplicate, and XADD would refuse it anyway.

local last = 0
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top > 0 then last = tonumber(string.match(top[1][1], '^(%d+)')) end

local added = 0
for i = 2, #ARGV, 2 do
    local seq = tonumber(ARGV[i])
    if seq > last then
        redis.call('XADD', KEYS[1], ARGV[i] .. '-0', 'e', ARGV[i + 1])
        last = seq
        added = added + 1
    end
end

redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1], 'LT')
return added
