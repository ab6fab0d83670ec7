-- List approvals newest first. KEYS: an index (order, or a tenant's), records, decisions,
-- deadlines, forget. ARGV: status wanted ('' for any), limit, chunk.
-- Returns a flat list, three items per approval: record JSON, decision JSON or '', status
-- ('decided', 'pending' or 'expired'). The status filter applies to the effective status: a
-- decided approval's is the decision's, read from its JSON.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local wanted, limit, chunk = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local out, found, start = {}, 0, 0
while found < limit do
    local members = redis.call('ZREVRANGE', KEYS[1], start, start + chunk - 1)
    if #members == 0 then break end
    for _, member in ipairs(members) do
        local forget = redis.call('ZSCORE', KEYS[5], member)
        local record = redis.call('HGET', KEYS[2], member)
        if forget and tonumber(forget) > now and record then
            local decision = redis.call('HGET', KEYS[3], member)
            local status, effective = 'decided', nil
            if decision then
                if wanted ~= '' then effective = cjson.decode(decision)['status'] end
            elseif tonumber(redis.call('ZSCORE', KEYS[4], member)) <= now then
                status, effective = 'expired', 'expired'
            else
                status, effective = 'pending', 'pending'
            end
            if wanted == '' or wanted == effective then
                out[#out + 1] = record
                out[#out + 1] = decision or ''
                out[#out + 1] = status
                found = found + 1
                if found == limit then break end
            end
        end
    end
    start = start + chunk
end
return out
