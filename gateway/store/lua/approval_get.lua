-- Read an approval. KEYS: records, decisions, deadlines, forget. ARGV: member.
-- Returns nil (unknown or forgotten), or {record JSON, decision JSON or '', status} where status
-- is 'decided', 'pending' or 'expired' (pending past its expires_at, by this server's clock).

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local member = ARGV[1]

local forget = redis.call('ZSCORE', KEYS[4], member)
if not forget or tonumber(forget) <= now then return nil end
local record = redis.call('HGET', KEYS[1], member)
if not record then return nil end
local decision = redis.call('HGET', KEYS[2], member)
if decision then return {record, decision, 'decided'} end
if tonumber(redis.call('ZSCORE', KEYS[3], member)) <= now then return {record, '', 'expired'} end
return {record, '', 'pending'}
