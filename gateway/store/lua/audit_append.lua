-- Append chained audit records if the chain still ends where the caller expects.
-- KEYS: head hash, stream. ARGV: expected_seq, expected_hash, then three per record:
-- seq, hash, canonical JSON. Returns 1 when appended, 0 (nothing written) when the head moved.

local head = redis.call('HMGET', KEYS[1], 'seq', 'hash')
if (head[1] or '0') ~= ARGV[1] or (head[2] or '') ~= ARGV[2] then return 0 end
if #ARGV < 5 then return 1 end

-- Explicit ids make XADD refuse to go backwards: if it fails it fails on the first record,
-- before anything is written.
for i = 3, #ARGV, 3 do
    redis.call('XADD', KEYS[2], ARGV[i] .. '-0', 'r', ARGV[i + 2])
end
redis.call('HSET', KEYS[1], 'seq', ARGV[#ARGV - 2], 'hash', ARGV[#ARGV - 1])
return 1
