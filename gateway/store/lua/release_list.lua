-- Every release of a model, oldest first. KEYS: records, the model's versions.
-- ARGV: the member prefix (`<model>:`, encoded as in keys.release_member) - versions in the zset
-- are raw, so each is encoded here the same way (percent-encoding every byte but unreserved ones).
-- Returns the records' JSON in order.

local function quote(s)
    return (string.gsub(s, '[^%w%-%._~]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

local versions = redis.call('ZRANGE', KEYS[2], 0, -1)
local out = {}
for _, version in ipairs(versions) do
    local record = redis.call('HGET', KEYS[1], ARGV[1] .. quote(version))
    if record then out[#out + 1] = record end
end
return out
