-- Create a release, unless that version exists (releases are immutable).
-- KEYS: records, the model's versions. ARGV: member, record JSON, version, created_at.
-- Returns 1 if stored, 0 if the version already existed (nothing changed).

if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return 1
