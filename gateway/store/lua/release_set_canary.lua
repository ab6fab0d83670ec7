-- Set or clear a model's canary: a compare-and-set on the model's generation (the one activation
-- bumps). KEYS: generations, canaries. ARGV: model, expected generation, '1' to set or '0' to
-- clear, the canary JSON (stored verbatim; empty when clearing).
-- Returns {1, new generation} or, changing nothing, {0, current generation}.

local generation = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if generation ~= tonumber(ARGV[2]) then return {0, generation} end

if ARGV[3] == '1' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
else
    redis.call('HDEL', KEYS[2], ARGV[1])
end
generation = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return {1, generation}
