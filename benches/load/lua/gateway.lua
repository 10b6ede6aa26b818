-- The load harness's Lua peer: nginx + Lua doing the gateway's job as a Kong plugin would, for
-- the routes the harness measures. benches/load/lua/nginx.conf.in loads it; harness.py fills in
-- the paths and ports and checks its answers against the gateway's before measuring.
--
--   GET /v1/public/domain/{domain}   key (401), origin (403), monthly count (429), the record
--   GET /v1/public/top-domains       the same, then the top-domains body the gateway answered
--   GET /v1/check/{target}           the same in the access phase, then proxy_pass (nginx.conf)
--
-- State: the keys, the domain lists and the top-domains body are read once, in init_by_lua
-- (before the workers fork); the month's counts live in a lua_shared_dict, one counter per
-- project and month, which every worker shares and a restart empties.

local ffi = require "ffi"

local byte, sub, find, lower, format, gsub = string.byte, string.sub, string.find, string.lower,
    string.format, string.gsub
local concat, floor = table.concat, math.floor

-- SHA-256 from the OpenSSL that nginx is linked with (what lua-resty-string's resty.sha256 does
-- too; Debian bookworm does not package it).
ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size,
               const EVP_MD *type, void *impl);
]]
local C = ffi.C
local digest = ffi.new("unsigned char[32]")

local function sha256(s)
    if C.EVP_Digest(s, #s, digest, nil, C.EVP_sha256(), nil) ~= 1 then
        return nil
    end
    return ffi.string(digest, 32)
end

local M = {}

local keys = {}       -- SHA-256 (32 bytes) of the secret -> key
local disposable = {} -- listed name -> true
local free = {}       -- free provider -> true
local top = { items = {}, bodies = {} }
local dataset_version = "lua"
local counts          -- the shared dict
local EXPOSE = "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, X-Dataset-Version, "
    .. "X-Did-You-Mean, X-RateLimit-Would-Reject"

-- Bodies --------------------------------------------------------------------------------------

-- A JSON string as serde_json writes it: quote, backslash and control characters escaped.
local SHORT = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
    ["\r"] = "\\r", ["\t"] = "\\t" }
local function json_string(s)
    return '"' .. gsub(s, '[%c"\\]', function(c)
        if c == "\127" then return c end
        return SHORT[c] or format("\\u%04x", byte(c))
    end) .. '"'
end

local function error_body(code, message, detail)
    return '{"error":"' .. code .. '","message":"' .. message .. '","detail":'
        .. (detail and json_string(detail) or "null") .. "}"
end

local UNAUTHORIZED = error_body("unauthorized",
    "A valid API key is required: send Authorization: Bearer <key>.")
local NOT_FOUND = error_body("not_found", "No such route.")
local METHOD = error_body("method_not_allowed", "This route does not accept that method.")

local function invalid(detail)
    return error_body("validation_error", "The request is not valid.", detail)
end

-- Answers: status, headers, body (Content-Length set: no chunked framing).
local function send(status, body, common)
    ngx.status = status
    local h = ngx.header
    h["Content-Type"] = "application/json; charset=utf-8"
    h["Content-Length"] = #body
    if common then
        h["x-dataset-version"] = dataset_version
        h["vary"] = "Origin"
    end
    ngx.print(body)
    return ngx.exit(ngx.HTTP_OK)
end

-- Domain names: the gateway's rules for ASCII input, and its 422 details -----------------------

-- A character as Rust's `{:?}` writes it (the gateway's `domain contains ...` detail).
local function rust_char(c)
    local escaped = ({ ["\t"] = "\\t", ["\n"] = "\\n", ["\r"] = "\\r", ["\0"] = "\\0",
        ["'"] = "\\'", ["\\"] = "\\\\" })[c]
    if escaped then
        return "'" .. escaped .. "'"
    end
    local b = byte(c)
    if b < 32 or b == 127 then
        return format("'\\u{%x}'", b)
    end
    return "'" .. c .. "'"
end

local function bad_char(c)
    return "domain contains " .. rust_char(c) .. ": only letters, digits, hyphens and dots are allowed"
end

-- The hostname rules (validate_ascii in crates/domain/src/name.rs), in the same order, on a
-- lowercase name without its trailing dot. Returns nil or the 422 detail.
local function validate(name)
    if name == "" then
        return "domain is empty"
    end
    if #name > 253 then
        return format("domain is %d characters long; the maximum is 253", #name)
    end
    local labels, pos, last = 0, 1, nil
    while true do
        local dot = find(name, ".", pos, true)
        local label = sub(name, pos, (dot or 0) - 1)
        labels = labels + 1
        if label == "" then
            return "domain has an empty label"
        end
        if #label > 63 then
            return format("label '%s' is %d characters long; the maximum is 63", label, #label)
        end
        local at = find(label, "[^%w%-]")
        if at then
            return bad_char(sub(label, at, at))
        end
        if byte(label, 1) == 45 or byte(label, -1) == 45 then
            return "label '" .. label .. "' starts or ends with a hyphen"
        end
        last = label
        if not dot then
            break
        end
        pos = dot + 1
    end
    if labels < 2 then
        return "domain has a single label; a registrable name such as example.com is expected"
    end
    if not find(last, "%D") then
        return "top-level label '" .. last .. "' is numeric: IP addresses are not domains"
    end
    return nil
end

-- The canonical name of a (percent-decoded) path segment, or nil and the 422 detail. No UTS-46
-- mapping: a name with a non-ASCII character is refused (the gateway answers its punycode).
local function canonical(input)
    if find(input, "@", 1, true) then
        return nil, "domain contains '@': send email addresses to /v1/check"
    end
    if input == "" then
        return nil, "domain is empty"
    end
    local at = find(input, "[%c ]")
    if at then
        return nil, bad_char(sub(input, at, at))
    end
    if find(input, "[\128-\255]") then
        return nil, "domain is not a valid internationalised name (UTS-46)"
    end
    local name = lower(input)
    if byte(name, -1) == 46 then
        name = sub(name, 1, -2)
    end
    local detail = validate(name)
    if detail then
        return nil, detail
    end
    return name
end

-- What the lists say of a name: the name and each parent down to the last two labels (the
-- gateway stops at the registrable domain, by the public suffix list). A free provider wins
-- over a listing, as in the gateway's table.
local function record(name)
    local free_at, listed_at
    local pos = 1
    while true do
        local level = pos == 1 and name or sub(name, pos)
        if not free_at and free[level] then
            free_at = level
        end
        if not listed_at and disposable[level] then
            listed_at = level
        end
        local dot = find(name, ".", pos, true)
        if not dot or not find(name, ".", dot + 1, true) then
            break
        end
        pos = dot + 1
    end
    local score, reason, is_free = 20, "safe", "false"
    if free_at then
        score, is_free = 10, "true"
    elseif listed_at == name then
        score, reason = 100, "disposable"
    elseif listed_at then
        score, reason = 95, "disposable"
    end
    return '{"domain":"' .. name .. '","risk_score":' .. score .. ',"reason":"' .. reason
        .. '","is_free_provider":' .. is_free .. ',"is_corporate_email":false,"mx_provider_label":null}'
end

-- Origins ---------------------------------------------------------------------------------------

-- scheme://host[:port] (a path, query or fragment after it only when `with_path`): scheme,
-- lowercase host (no IDNA), port; nil when it is not one.
local function parse_origin(value, with_path, wildcard)
    local scheme, rest = value:match("^(%a+)://(.*)$")
    if not scheme then
        return nil
    end
    scheme = lower(scheme)
    if scheme ~= "http" and scheme ~= "https" then
        return nil
    end
    local cut = find(rest, "[/?#]")
    if cut then
        if not with_path then
            return nil
        end
        rest = sub(rest, 1, cut - 1)
    end
    if rest == "" or find(rest, "@", 1, true) then
        return nil
    end
    local host, port = rest:match("^(.*):(%d+)$")
    if host then
        port = tonumber(port)
        if port > 65535 then
            return nil
        end
    else
        host = rest
    end
    host = lower(host)
    local bare = host
    if wildcard and sub(host, 1, 2) == "*." then
        bare = sub(host, 3)
    end
    if bare == "" or find(bare, "[^%w%.%-]") then
        return nil
    end
    return scheme, host, port or (scheme == "https" and 443 or 80)
end

local function origin_allowed(key, scheme, host, port)
    for _, p in ipairs(key.origins) do
        if p.scheme == scheme and p.port == port then
            if p.suffix then
                if #host > #p.suffix and sub(host, -#p.suffix) == p.suffix then
                    return true
                end
            elseif p.host == host then
                return true
            end
        end
    end
    return false
end

-- Nil when the request may use `key` from where it comes, else the 403 detail; with the
-- allowed origin (for Access-Control-Allow-Origin) as the second value.
local function check_origin(key)
    local h = ngx.var.http_origin
    local raw, scheme, host, port = h, nil, nil, nil
    if h then
        scheme, host, port = parse_origin(h, false)
    else
        raw = ngx.var.http_referer
        if raw then
            scheme, host, port = parse_origin(raw, true)
        end
    end
    if scheme and origin_allowed(key, scheme, host, port) then
        local default = (scheme == "https" and 443 or 80)
        return nil, scheme .. "://" .. host .. (port == default and "" or ":" .. port)
    end
    return "Origin: " .. (raw or "(none)")
end

-- The month ----------------------------------------------------------------------------------

-- Days since 1970-01-01 of a civil date (proleptic Gregorian).
local function days(y, m, d)
    if m <= 2 then
        y = y - 1
    end
    local era = floor(y / 400)
    local yoe = y - era * 400
    local mp = (m + 9) % 12
    local doy = floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end

local month = { reset = -1 }

-- The UTC month of `secs`, recomputed once a month per worker.
local function month_of(secs)
    if secs < month.reset then
        return month
    end
    local t = os.date("!*t", secs)
    local start = days(t.year, t.month, 1) * 86400
    local ny, nm = t.year, t.month + 1
    if nm == 13 then
        ny, nm = ny + 1, 1
    end
    local reset = days(ny, nm, 1) * 86400
    month = { id = format("%04d-%02d", t.year, t.month), start = start, reset = reset,
        seconds = reset - start, reset_at = os.date("!%Y-%m-%dT%H:%M:%SZ", reset) }
    return month
end

-- Counts the call in the project's month: nil when over the limit (nothing counted), else the
-- calls left; with the RateLimit-Policy and RateLimit values and the seconds to the reset.
local function count(key)
    local now = ngx.now()
    local secs = floor(now)
    local m = month_of(secs)
    if key.month ~= m.id then
        key.month = m.id
        key.counter = key.project .. "|" .. m.id
        key.policy = format('"monthly";q=%.0f;w=%d', key.limit, m.seconds)
    end
    -- Whole seconds to the reset, a started second not left (as the gateway counts them).
    local left_s = m.reset - secs - (now > secs and 1 or 0)
    if left_s < 1 then
        left_s = 1
    end
    local n, err = counts:incr(key.counter, 1, 0, m.reset - secs + 86400)
    if not n then
        ngx.log(ngx.ERR, "quota counter: ", err)
        return nil, nil, nil, nil, err
    end
    if n > key.limit then
        counts:incr(key.counter, -1)
        return nil, key.policy, format('"monthly";r=0;t=%d', left_s), left_s
    end
    local left = key.limit - n
    return left, key.policy, format('"monthly";r=%.0f;t=%d', left, left_s), left_s
end

-- Access: key, origin, quota -------------------------------------------------------------------

-- The key of the request, or an answer already sent (401, 403, 429, 503). `common`: whether
-- this call adds X-Dataset-Version and Vary itself (the check location's add_header does it).
local function admit(common)
    local auth = ngx.var.http_authorization
    local key
    if auth then
        local token = auth:match("^[Bb][Ee][Aa][Rr][Ee][Rr] +([^ ]+) *$")
        key = token and keys[sha256(token)]
    end
    if not key then
        ngx.header["www-authenticate"] = auth and 'Bearer realm="domain-risk", error="invalid_token"'
            or 'Bearer realm="domain-risk"'
        return send(401, UNAUTHORIZED, common)
    end
    local allow_origin
    if key.origins then
        local refused
        refused, allow_origin = check_origin(key)
        if refused then
            return send(403, error_body("forbidden", "This API key may not be used from this origin.",
                refused), common)
        end
    end
    local left, policy, now, reset_s, failed = count(key)
    if failed then
        return send(503, error_body("quota_unavailable", "The quota store is unavailable."), common)
    end
    if not left then
        local h = ngx.header
        h["retry-after"] = reset_s
        if common then
            h["x-dataset-version"] = dataset_version
            h["vary"] = "Origin"
        end
        h["ratelimit-policy"] = policy
        h["ratelimit"] = now
        return send(429, '{"error":"quota_exceeded","message":"The monthly quota of this API key is used '
            .. 'up; let your user through.","detail":null,"reset_at":"' .. month.reset_at .. '"}')
    end
    return key, policy, now, allow_origin
end

-- Sets the headers of an admitted call's answer (the content routes).
local function admitted_headers(policy, now, allow_origin)
    local h = ngx.header
    h["x-dataset-version"] = dataset_version
    h["vary"] = "Origin"
    h["ratelimit-policy"] = policy
    h["ratelimit"] = now
    if allow_origin then
        h["access-control-allow-origin"] = allow_origin
        h["access-control-expose-headers"] = EXPOSE
    end
end

-- The content routes ---------------------------------------------------------------------------

-- Percent-decoding only (ngx.unescape_uri also turns `+` into a space).
local function unescape(s)
    if not find(s, "%", 1, true) then
        return s
    end
    return (gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local DOMAIN = "/v1/public/domain/"
local TOP = "/v1/public/top-domains"

local function top_body(limit)
    local body = top.bodies[limit]
    if not body then
        local n = math.min(limit, #top.items)
        body = '{"domains":[' .. concat(top.items, ",", 1, n) .. '],"count":' .. n .. "}"
        top.bodies[limit] = body
    end
    return body
end

-- location /: the domain lookup and top-domains; anything else is 404.
function M.serve()
    local uri = ngx.var.request_uri
    local q = find(uri, "?", 1, true)
    local path = q and sub(uri, 1, q - 1) or uri
    local v1 = sub(path, 1, 4) == "/v1/"
    local raw, limit
    if sub(path, 1, #DOMAIN) == DOMAIN then
        raw = sub(path, #DOMAIN + 1)
    elseif path == TOP then
        limit = top.default
        local value = q and ngx.var.arg_limit
        if value then
            value = unescape(value)
            local n = value:match("^%d+$") and tonumber(value)
            if not n or n < 1 or n > 1000 then
                return send(422, invalid("limit must be an integer from 1 to 1000; got '" .. value .. "'"), true)
            end
            limit = n
        end
    else
        return send(404, NOT_FOUND, v1)
    end
    if ngx.req.get_method() ~= "GET" then
        ngx.header["allow"] = "GET, OPTIONS"
        return send(405, METHOD, true)
    end
    local _, policy, now, allow_origin = admit(true)
    admitted_headers(policy, now, allow_origin)
    if limit then
        return send(200, top_body(limit))
    end
    local name, detail = canonical(unescape(raw))
    if not name then
        return send(422, invalid(detail))
    end
    return send(200, record(name))
end

-- access_by_lua of location /v1/check/: the same admission, then nginx proxies the call with
-- the key's id (nginx.conf); the answer's RateLimit headers come from these variables.
function M.check()
    if ngx.var.uri == "/v1/check/" then
        return send(422, invalid("target is empty"))
    end
    if ngx.req.get_method() ~= "GET" then
        ngx.header["allow"] = "GET, OPTIONS"
        return send(405, METHOD)
    end
    local key, policy, now, allow_origin = admit(false)
    local v = ngx.var
    v.drg_key_id = key.id
    v.drg_ratelimit_policy = policy
    v.drg_ratelimit = now
    if allow_origin then
        v.drg_allow_origin = allow_origin
        v.drg_expose = EXPOSE
    end
end

-- init_by_lua ------------------------------------------------------------------------------------

local function unhex(s)
    return (gsub(s, "%x%x", function(h) return string.char(tonumber(h, 16)) end))
end

-- One name a line, `#` starts a comment, blank lines skipped (the gateway's list format).
local function read_list(path, into)
    local f = io.open(path)
    if not f then
        return 0
    end
    local n = 0
    for line in f:lines() do
        local name = lower(line:gsub("#.*", ""):match("^%s*(.-)%s*$"))
        if name ~= "" then
            if byte(name, -1) == 46 then
                name = sub(name, 1, -2)
            end
            into[name] = true
            n = n + 1
        end
    end
    f:close()
    return n
end

-- opts: keys (a file of `sha256<TAB>id<TAB>project<TAB>monthly limit<TAB>origins, space-separated
-- or -`), data (the gateway's data folder), top (the top-domains body), dict (the shared dict),
-- version (the X-Dataset-Version value; the check location's add_header sends the same).
function M.init(opts)
    for line in io.lines(opts.keys) do
        local hash, id, project, limit, origins = line:match("^(%x+)\t([^\t]+)\t([^\t]+)\t(%d+)\t(.*)$")
        if hash then
            local key = { id = id, project = project, limit = tonumber(limit) }
            if origins ~= "-" and origins ~= "" then
                key.origins = {}
                for pattern in origins:gmatch("%S+") do
                    local scheme, host, port = parse_origin(pattern, false, true)
                    assert(scheme, "not an origin pattern: " .. pattern)
                    local p = { scheme = scheme, host = host, port = port }
                    if sub(host, 1, 2) == "*." then
                        p.suffix = sub(host, 2)
                    end
                    key.origins[#key.origins + 1] = p
                end
            end
            keys[unhex(lower(hash))] = key
        end
    end
    local listed = read_list(opts.data .. "/disposable.txt", disposable)
    read_list(opts.data .. "/free_providers.txt", free)
    dataset_version = opts.version or ("lua-" .. listed)
    local f = assert(io.open(opts.top))
    local body = f:read("*a")
    f:close()
    for item in body:gmatch('{"domain":"[^"]*","risk_score":%d+,"reason":"[^"]*"}') do
        top.items[#top.items + 1] = item
    end
    -- The default limit (the gateway's, 100): the answer is the file, byte for byte.
    top.default = 100
    top.bodies[top.default] = body
    counts = ngx.shared[opts.dict]
    assert(counts, "no lua_shared_dict " .. tostring(opts.dict))
end

return M
