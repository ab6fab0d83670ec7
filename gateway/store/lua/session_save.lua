-- Create or replace a session's state and refresh the whole session's TTL.
-- KEYS: state, events stream, lease. ARGV: state JSON, ttl_ms.
-- The lease keeps its own expiry: LT may cut it to the session's, never extends it.

redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2], 'LT')
return 1
