-- Check and take every limit of every scope, all or nothing (see gateway/store/base.py).
-- KEYS: four per scope, in order: requests hash, tokens hash, daily hash, leases zset.
-- ARGV: window_s, window_ttl_s, daily_ttl_s, lease_margin_s, lease_id, tokens, lease_ttl_s,
--       then five per scope: name, rpm, tpm, daily_tokens, max_concurrency ('' = unlimited).
-- Returns JSON: {admitted, second, day, denied_scope, denied_limit, retry_after, usage}.
-- The server's clock is the only clock, so replicas with skewed clocks share one window.

local window = tonumber(ARGV[1])
local window_ttl, daily_ttl, lease_margin = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease_id, tokens, lease_ttl = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])

local time = redis.call('TIME')
local sec = tonumber(time[1])
local now = sec + tonumber(time[2]) / 1000000
local day = math.floor(sec / 86400)
-- Fields as the integers Python's settle passes back, whatever Lua's number formatting.
local sec_field, day_field = string.format('%d', sec), string.format('%d', day)

local function limit(value)
    if value == '' then return nil end
    return tonumber(value)
end

-- Drops buckets that left the window; returns the rest oldest first, and their sum.
local function live_buckets(key)
    local raw = redis.call('HGETALL', key)
    local live, stale, sum = {}, {}, 0
    for i = 1, #raw, 2 do
        local second, count = tonumber(raw[i]), tonumber(raw[i + 1])
        if second <= sec - window then
            stale[#stale + 1] = raw[i]
        else
            live[#live + 1] = {second, count}
            sum = sum + count
        end
    end
    if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
    table.sort(live, function(a, b) return a[1] < b[1] end)
    return live, sum
end

-- Seconds until enough of the oldest buckets leave the window for `need` more to fit.
local function window_retry(live, used, need, cap)
    if need > cap then return window end -- never fits; the caller should not retry soon
    local excess = used + need - cap
    for _, bucket in ipairs(live) do
        excess = excess - bucket[2]
        if excess <= 0 then return math.max(1, bucket[1] + window - now) end
    end
    return window
end

-- Seconds until the window holds nothing (OpenAI's x-ratelimit-reset-*), given what it holds.
local function window_reset(live, taken)
    if taken > 0 then return sec + window - now end
    for i = #live, 1, -1 do
        if live[i][2] > 0 then return math.max(0, live[i][1] + window - now) end
    end
    return 0
end

local function daily_used(key)
    local raw = redis.call('HGETALL', key)
    local stale, used = {}, 0
    for i = 1, #raw, 2 do
        local counted_day = tonumber(raw[i])
        if counted_day == day then used = tonumber(raw[i + 1]) end
        -- yesterday's counter stays until its requests have settled
        if counted_day < day - 1 then stale[#stale + 1] = raw[i] end
    end
    if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
    return used
end

local scopes = {}
local denial = nil
local function deny(scope, name, retry)
    if denial == nil or retry > denial.retry then denial = {scope = scope, limit = name, retry = retry} end
end

for i = 0, (#ARGV - 7) / 5 - 1 do
    local a, k = 8 + i * 5, 1 + i * 4
    local s = {
        name = ARGV[a], rpm = limit(ARGV[a + 1]), tpm = limit(ARGV[a + 2]),
        daily = limit(ARGV[a + 3]), max_concurrency = limit(ARGV[a + 4]),
        requests_key = KEYS[k], tokens_key = KEYS[k + 1], daily_key = KEYS[k + 2], leases_key = KEYS[k + 3],
    }
    if s.rpm then
        s.requests, s.requests_used = live_buckets(s.requests_key)
        if s.requests_used + 1 > s.rpm then
            deny(s.name, 'rpm', window_retry(s.requests, s.requests_used, 1, s.rpm))
        end
    end
    if s.tpm then
        s.tokens, s.tokens_used = live_buckets(s.tokens_key)
        if s.tokens_used + tokens > s.tpm then
            deny(s.name, 'tpm', window_retry(s.tokens, s.tokens_used, tokens, s.tpm))
        end
    end
    if s.daily and daily_used(s.daily_key) + tokens > s.daily then
        deny(s.name, 'daily_tokens', (day + 1) * 86400 - now)
    end
    if s.max_concurrency then
        redis.call('ZREMRANGEBYSCORE', s.leases_key, '-inf', now)
        if redis.call('ZCARD', s.leases_key) >= s.max_concurrency then
            deny(s.name, 'max_concurrency', 1)
        end
    end
    scopes[#scopes + 1] = s
end

local admitted = denial == nil
local usage = {}
for _, s in ipairs(scopes) do
    if admitted then
        if s.rpm then
            redis.call('HINCRBY', s.requests_key, sec_field, 1)
            redis.call('EXPIRE', s.requests_key, window_ttl)
        end
        if s.tpm then
            redis.call('HINCRBY', s.tokens_key, sec_field, tokens)
            redis.call('EXPIRE', s.tokens_key, window_ttl)
        end
        if s.daily then
            redis.call('HINCRBY', s.daily_key, day_field, tokens)
            redis.call('EXPIRE', s.daily_key, daily_ttl)
        end
        if s.max_concurrency then
            redis.call('ZADD', s.leases_key, now + lease_ttl, lease_id)
            -- NX sets a first expiry, GT only ever extends it: a short lease must not cut a long one.
            local ms = math.ceil((lease_ttl + lease_margin) * 1000)
            redis.call('PEXPIRE', s.leases_key, ms, 'NX')
            redis.call('PEXPIRE', s.leases_key, ms, 'GT')
        end
    end
    local u = {}
    if s.rpm then
        local taken = admitted and 1 or 0
        u.requests_remaining = math.max(0, s.rpm - s.requests_used - taken)
        u.requests_reset_s = window_reset(s.requests, taken)
    end
    if s.tpm then
        local taken = admitted and tokens or 0
        u.tokens_remaining = math.max(0, s.tpm - s.tokens_used - taken)
        u.tokens_reset_s = window_reset(s.tokens, taken)
    end
    usage[s.name] = u
end

local result = {admitted = admitted, second = sec, day = day, usage = usage}
if denial then
    result.denied_scope, result.denied_limit, result.retry_after = denial.scope, denial.limit, denial.retry
end
return cjson.encode(result)
