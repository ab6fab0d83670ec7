-- Insert or replace a key record together with its indexes.
-- KEYS: records hash, digests hash, the tenant's id set. ARGV: id, digest, record JSON.
-- A rotated key drops its old digest, so the old secret stops resolving at once.

local id, digest = ARGV[1], ARGV[2]
local old = redis.call('HGET', KEYS[1], id)
if old then
    local old_digest = cjson.decode(old)['digest']
    if old_digest ~= digest and redis.call('HGET', KEYS[2], old_digest) == id then
        redis.call('HDEL', KEYS[2], old_digest)
    end
end
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('HSET', KEYS[2], digest, id)
redis.call('SADD', KEYS[3], id)
return 1
