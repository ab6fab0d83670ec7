-- Mark a live approval's answer collected, once. KEYS: decisions, forget. ARGV: member.
-- Returns 1 if this call marked it, 0 if it was collected before, -1 if unknown or forgotten.
-- The mark lives in the decisions hash as `<member>#redeemed` (a member is percent-encoded, so
-- it holds no '#'), and is removed with the decision when the approval is forgotten.

local t = redis.call('TIME')
local member = ARGV[1]
local forget = redis.call('ZSCORE', KEYS[2], member)
if not forget or tonumber(forget) <= tonumber(t[1]) + tonumber(t[2]) / 1000000 then return -1 end
if redis.call('HSETNX', KEYS[1], member .. '#redeemed', t[1]) == 0 then return 0 end
local forget_ms = math.ceil(tonumber(forget) * 1000)
if redis.call('PTTL', KEYS[1]) == -1 then
    redis.call('PEXPIREAT', KEYS[1], forget_ms)
else
    redis.call('PEXPIREAT', KEYS[1], forget_ms, 'GT')
end
return 1
