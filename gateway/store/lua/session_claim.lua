-- Take or renew a session's live-stream lease.
-- KEYS: lease. ARGV: owner, ttl_ms. Returns 1 if `owner` now holds it, 0 if another does.
-- An expired lease is gone (PX), so SET NX takes it.

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
