-- Activate a release: a compare-and-set on the model's generation, which also ends the model's
-- canary. KEYS: records, active, generations, the model's history, canaries. ARGV: model, member,
-- version, expected generation, history entry JSON (already carrying the new generation),
-- history cap.
-- Returns {1, new generation} or, changing nothing, {0, current generation} when the generation
-- moved on or the release does not exist. A script runs alone: of concurrent activations with
-- one expected generation, the first wins and the rest see its generation.

local generation = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if generation ~= tonumber(ARGV[4]) then return {0, generation} end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then return {0, generation} end

redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
generation = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('LPUSH', KEYS[4], ARGV[5])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[6]) - 1)
redis.call('HDEL', KEYS[5], ARGV[1])
return {1, generation}
