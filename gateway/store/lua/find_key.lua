-- The record of the key whose secret hashes to ARGV[1], in one round trip and one snapshot.
-- KEYS: records hash, digests hash.

local id = redis.call('HGET', KEYS[2], ARGV[1])
if not id then return false end
return redis.call('HGET', KEYS[1], id)
