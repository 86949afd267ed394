-- relay's session log in Redis: every write and every read of a session is
-- one call of this script, which Redis runs alone, so two instances can
-- never store one id twice or hand out one seq twice. The rules are the
-- in-memory log's (src/store/log.rs): history keeps the newest `limit`
-- messages; a prompt is known (deduplicated) while pending or in history,
-- an answer while in history.
--
-- Keys of a session (prefix P):
--   P s:<sid>  hash   the whole session, so that a write reads what it
--                     needs in one call and writes it in another:
--                       e epoch, n next seq, la newest answer's (or
--                       cancel's: a framed message) seq, da newest one
--                       history dropped, pc pending
--                       count, t the second (unix) in which the
--                       session's score in `sessions` was set, pe
--                       the epoch before `renew` gave it a new one;
--                       <seq> -> a record, as the relay sent it:
--                       "P\ncid\n\nts\nhead" (a prompt),
--                       "A\ncid\naid\nts\nhead" (an answer) or
--                       "X\ncid\n\nts\nhead" (a cancel of the prompt
--                       cid), where the
--                       message's JSON is head .. seq .. "}" (the script
--                       never builds or parses it; records written
--                       before this format, kind p or a, hold the whole
--                       JSON): history, and the pending prompts it
--                       dropped;
--                       c:<client_msg_id> -> seq (negative once answered
--                       or cancelled);
--                       x:<client_msg_id> -> the seq of the cancel that
--                       stopped the prompt, while c: is kept;
--                       a:<assistant_msg_id> -> seq;
--                       asks (src/store/asks.rs): <seq> -> an ask,
--                       "K\nask_id\nexpires_ts\nts\nhead", or a reply,
--                       "Y\nask_id\n\nts\nhead"; k:<ask_id> -> the
--                       ask's seq (negative once answered); y:<ask_id> ->
--                       "seq\ntext" of its reply; ko -> the unanswered
--                       asks, "seq:expires_ts" joined by ",". An ask is
--                       known while in history, or unanswered and not
--                       expired; one history dropped is kept (like a
--                       pending prompt) only while it may still be
--                       answered
--   P w:<sid>  hash   instance -> unix ms until which it has subscribers
--                     of the session (an answer's `delivered`)
--   P d:<sid>  hash   the session's streamed answers in progress:
--                     assistant_msg_id -> "cid\nparts\nbytes\ndeadline\ntext"
--                     (text: the parts' JSON literals without quotes);
--                     a draft past its deadline (unix ms) is dead, and the
--                     key expires with the newest deadline
--   P g:<sid>  hash   instance -> "until\nseen": the unix ms until which
--                     an agent is online there, and when it was last seen;
--                     the key expires with its newest entry
--   P sessions zset   sid -> last activity (unix ms, to the second: a
--                     write moves it once a second at most): the TTL and
--                     the cap
--   P generation  string  the store's UUID, set by `probe` (lost with it)
--   P arrived  string  the number of the last prompt that became pending
--                     anywhere (its arrival); a store without it starts
--                     from the clock (ms times 1000), above every number
--                     handed out before it was lost
--   P pending  zset   every pending prompt, "sid\nseq" -> its arrival
--                     number: the order of an agent serving every
--                     session (`every`). A prompt leaves when it is
--                     answered or cancelled, or its session deleted;
--                     `every` drops an entry that no longer names a
--                     pending prompt as it meets it
--   P agents   hash   "instance\nscope" -> "until\nseen\nparked": the
--                     agents polling every session a token opens
--                     (`everyagent`); the key expires with its newest
--                     entry
-- In a Redis Cluster (src/store/redis/slot.rs) P is a bucket's base,
-- `<prefix>{<tag>}`: a session's keys and its bucket's sessions, pending,
-- arrived and generation share one hash slot, and every call names in
-- KEYS each key it may touch (the ones it finds on its way aside: the
-- idle sessions `collect` meets, the sessions `every` lists). There,
-- changes go out with SPUBLISH on channels of the same slot, a bucket's
-- arrival numbers step by 64 from its index, `every` raises the counter
-- to a floor (see `every`), and a missing session's keys are left alone
-- (its slot may be migrating).
-- Every change is published on the session's channel (P e:<sid>), which
-- the instances with someone waiting on the session listen to. Each
-- arrival is also published on P arrivals ("sid\nnumber"), which an
-- instance listens to while an agent polls every session there, and the
-- agents of every session on P events, which every instance listens to.
--
-- A refused write leaves no trace (see mod.rs): each write makes its
-- growing write (HSET, ZADD) first, deletes after it, and publishes last.
--
-- Answer: {status, extra, epoch, n, la, da, full, generation, records...}:
-- the session as it is after the call, as the records the caller lacks
-- (it says what it holds in known_epoch and known_next), each as two
-- elements, its seq and the record; `full` says they
-- are the whole session rather than what follows known_next, and only
-- then is `generation` given. An empty epoch: the session does not exist
-- (the generation follows it).
--
-- `prompts` stores the prompts of one loop turn of the caller, in order,
-- each as `prompt` would, and answers the list of their answers: the
-- cost of a call (FCALL or EVALSHA, and with EVALSHA the helpers
-- below, made again on every call) is paid once for all of them. Its keys are
-- (unused, sessions, unused, then P s:<sid> of each prompt; in a cluster
-- pending, sessions, arrived, the sessions, then generation); its
-- arguments after the common ones are 6 per prompt: sid, known_epoch,
-- known_next, new_epoch, client_msg_id, record.
--
-- What a call costs Redis is mostly this script's own work (the Lua
-- around each redis.call, the strings it makes, their garbage), so the
-- hot path (a prompt) makes no string it can take as sent, converts
-- between numbers and strings only where it computes, and writes only
-- the counters it changed.

-- The call's keys and arguments, and what they say; set by `run` at
-- the start of every call (the helpers below read them).
local K, A
local s, all, w
local op, sid, now_ms
-- known_next stays a string until a call needs its value (see `answer`).
local known_epoch, known_next
local limit, max_pending
local new_epoch, channel, prefix
-- The arrival counter and order (see the keys above).
local arrived_key, pending_key
-- Whether the keys are laid out in buckets for a Redis Cluster (the
-- prefix is a bucket's base, `P{tag}`): changes are then published with
-- SPUBLISH, on channels in the call's own slot.
local cluster, publish_command, layout_of
-- The unix second of now: the activity score moves when it changes.
local second
-- Now as a number, for the ops that compare times.
local now
-- Messages to publish, channel then message, sent by `done`.
local published
-- Fields of the session to delete once its growing write went through
-- (nil: none).
local drops
-- The record this call wrote, its seq as a number and as a string: the
-- answer carries it without reading it back.
local wn, wq, wv

local function begin(keys, argv)
  K, A = keys, argv
  s, all, w = K[1], K[2], K[3]
  op, sid, now_ms = A[1], A[2], A[3]
  known_epoch, known_next = A[4], A[5]
  -- `x + 0` where x is always a number: Lua 5.1's tonumber parses its
  -- argument twice (strtod each time), arithmetic once.
  limit, max_pending = A[6] + 0, A[8] + 0
  new_epoch, channel, prefix = A[9], A[10], A[11]
  arrived_key, pending_key = prefix .. 'arrived', prefix .. 'pending'
  -- Told once per prefix (a library keeps it between calls).
  if prefix ~= layout_of then
    layout_of = prefix
    cluster = string.byte(prefix, -1) == 125
    publish_command = cluster and 'SPUBLISH' or 'PUBLISH'
  end
  second = string.sub(now_ms, 1, -4)
  now = 0
  if op ~= 'prompt' and op ~= 'prompts' then
    now = tonumber(now_ms)
  end
  published, drops = {}, nil
  wn, wq, wv = nil, nil, nil
end

-- A number as Redis takes it. Lua's own conversion (`..`, or a number
-- passed to redis.call) prints a double with "%.14g", which costs more
-- than the redis.call it feeds; "%d" is an integer's.
local function str(n)
  return string.format('%d', n)
end

-- The store's generation, or '' (a read never sets it).
local function generation()
  return redis.call('GET', prefix .. 'generation') or ''
end

local function publish(ch, message)
  local n = #published
  published[n + 1], published[n + 2] = ch, message
end

-- The session's counters, and the fields named after them (v[7] on):
-- what a write needs to know, in one call. `q` is n as stored (the seq
-- of the next message); la and da stay strings (the answer carries them
-- as they are).
local function session(...)
  local v = redis.call('HMGET', s, 'e', 'n', 'la', 'da', 'pc', 't', ...)
  if not v[1] then
    return nil, v
  end
  return { e = v[1], n = v[2] + 0, q = v[2], la = v[3], da = v[4], pc = v[5] + 0, t = v[6] }, v
end

-- A redis.call costs about as much as the Lua around it, so a write makes
-- as few as it can: one HSET of `fields` (field, value, ...: the records
-- and the counters the write changed), and the activity score moves once
-- a second; then the deletions `append` gathered.
local function save(S, fields)
  if S.dropped then
    fields[#fields + 1], fields[#fields + 2] = 'da', S.da
  end
  if S.t ~= second then
    redis.call('ZADD', all, now_ms, sid)
    fields[#fields + 1], fields[#fields + 2] = 't', second
  end
  redis.call('HSET', s, unpack(fields))
  if drops then
    redis.call('HDEL', s, unpack(drops))
    drops = nil
  end
end

local function create()
  if redis.call('ZCARD', all) >= tonumber(A[7]) then
    return nil
  end
  redis.call('HSET', s, 'e', new_epoch, 'n', '1', 'la', '0', 'da', '0', 'pc', '0', 't', second)
  redis.call('ZADD', all, now_ms, sid)
  publish(channel, 'C\n' .. sid .. '\n' .. new_epoch)
  return { e = new_epoch, n = 1, q = '1', la = '0', da = '0', pc = 0, t = second }
end

local function answer(status, S, extra)
  -- The usual case: the caller held everything before the one record
  -- this call wrote.
  if S.e == known_epoch and wn and (known_next == wq or known_next == wn) and S.n == wn + 1 then
    return { status, extra or '', S.e, S.n, S.la, S.da, '0', '', wq, wv }
  end
  local out = { status, extra or '', S.e, S.n, S.la, S.da, '0', '' }
  local kn = tonumber(known_next)
  if S.e == known_epoch and kn and kn >= S.n - limit and kn <= S.n then
    for q = kn, S.n - 1 do
      if q == wn then
        out[#out + 1], out[#out + 2] = wq, wv
      else
        local r = redis.call('HGET', s, q)
        if r then
          out[#out + 1], out[#out + 2] = str(q), r
        end
      end
    end
  else
    out[7] = '1'
    out[8] = generation()
    -- An epoch renewed after a failover (`renew`) names the one before
    -- it, so that a copy of that one is read as renewed, not deleted.
    local pe = redis.call('HGET', s, 'pe')
    if pe then
      out[3] = S.e .. '\n' .. pe
    end
    local kv = redis.call('HGETALL', s)
    local seqs = {}
    local byseq = {}
    for i = 1, #kv, 2 do
      if string.find(kv[i], '^%d+$') then
        local q = tonumber(kv[i])
        seqs[#seqs + 1] = q
        byseq[q] = kv[i + 1]
      end
    end
    table.sort(seqs)
    for _, q in ipairs(seqs) do
      out[#out + 1], out[#out + 2] = str(q), byseq[q]
    end
  end
  return out
end

local function gone(status)
  return { status, '', '', '', '', '', '', generation() }
end

-- Appends `record` (as the relay sent it), and marks what history no
-- longer keeps for `save` to drop. Returns the message's seq, and the
-- fields that store it and the new next seq, for `save` (room for four
-- more, made in one step).
local function append(S, record)
  local seq = S.n
  local q = S.q
  S.n = seq + 1
  wn, wq, wv = seq, q, record
  publish(channel, 'M\n' .. sid .. '\n' .. S.e .. '\n' .. q .. '\n' .. record)
  local d = seq - limit
  if d >= 1 then
    local ds = str(d)
    local old = redis.call('HGET', s, ds)
    if old then
      local kind, cid, aid = string.match(old, '^(%a)\n([^\n]*)\n([^\n]*)\n')
      if kind == 'p' or kind == 'P' then
        if tonumber(redis.call('HGET', s, 'c:' .. cid) or '0') < 0 then
          drops = { ds, 'c:' .. cid, 'x:' .. cid }
        end
      elseif kind == 'X' then
        drops = { ds }
        S.da, S.dropped = ds, true
      elseif kind == 'K' then
        -- An ask leaves history: kept while it may still be answered
        -- (unanswered, not expired); `aid` holds its expires_ts.
        S.da, S.dropped = ds, true
        local kv = tonumber(redis.call('HGET', s, 'k:' .. cid) or '0')
        if math.abs(kv) ~= d then
          drops = { ds }
        elseif kv < 0 or (tonumber(aid) or 0) <= tonumber(now_ms) then
          drops = { ds, 'k:' .. cid, 'y:' .. cid }
        end
      else
        drops = { ds }
        if tonumber(redis.call('HGET', s, 'a:' .. aid) or '0') == d then
          drops[2] = 'a:' .. aid
        end
        S.da, S.dropped = ds, true
      end
    end
  end
  return seq, { q, record, 'n', str(seq + 1), false, false, false, false }
end

-- '1' when an instance has subscribers of the session (`delivered`).
local function watched()
  local watching = redis.call('HGETALL', w)
  for i = 2, #watching, 2 do
    if tonumber(watching[i]) > now then
      return '1'
    end
  end
  return '0'
end

-- An agent's state in the hash `key` (`field` -> `value`) while it is
-- online (`untl` ahead), the key expiring with its newest entry; gone
-- once it is not.
local function keep_until(key, field, untl, value)
  if untl > now then
    redis.call('HSET', key, field, value)
    if redis.call('PTTL', key) < untl - now then
      redis.call('PEXPIRE', key, untl - now)
    end
  else
    redis.call('HDEL', key, field)
  end
end

-- A draft's fields: cid, parts, bytes, deadline, text.
local function draft_of(v)
  local cid, parts, bytes, deadline, text = string.match(v, '^([^\n]*)\n(%d+)\n(%d+)\n(%d+)\n(.*)$')
  return cid, tonumber(parts), tonumber(bytes), tonumber(deadline), text
end

-- A stored record's message JSON (kind: p, a, or P, A: without its
-- seq, which does not matter here).
local function json_of(kind, data)
  if kind == 'P' or kind == 'A' then
    return data .. '0}'
  end
  return data
end

local function text_of(data)
  local ok, v = pcall(cjson.decode, data)
  if ok and type(v) == 'table' then
    return v.text
  end
  return nil
end

-- The unanswered asks (`ko`) as a list of {seq, expires_ts}.
local function asks_of(ko)
  local out = {}
  for q, e in string.gmatch(ko or '', '(%d+):(%d+)') do
    out[#out + 1] = { tonumber(q), tonumber(e) }
  end
  return out
end

local function asks_str(list)
  local parts = {}
  for i, a in ipairs(list) do
    parts[i] = str(a[1]) .. ':' .. str(a[2])
  end
  return table.concat(parts, ',')
end

-- Asks open now: counted with the pending prompts against the cap.
local function open_asks(ko)
  local t, n = tonumber(now_ms), 0
  for _, a in ipairs(asks_of(ko)) do
    if a[2] > t then
      n = n + 1
    end
  end
  return n
end

-- The ask `kv` (k:<ask_id>) names, if it is known now: its seq, whether
-- it is answered, its expires_ts and its message's head.
local function known_ask(S, kv)
  if not kv then
    return nil
  end
  local q = math.abs(tonumber(kv))
  local rec = redis.call('HGET', s, str(q))
  if not rec then
    return nil
  end
  local expires, head = string.match(rec, '^K\n[^\n]*\n(%d+)\n[^\n]*\n(.*)$')
  expires = tonumber(expires) or 0
  local answered = tonumber(kv) < 0
  if q >= S.n - limit or (not answered and expires > now) then
    return { q = q, answered = answered, expires = expires, head = head or '' }
  end
  return nil
end

-- A decoded JSON value, or nil.
local function decoded(json)
  local ok, v = pcall(cjson.decode, json)
  if ok then
    return v
  end
  return nil
end

local function same_list(a, b)
  if type(a) ~= 'table' or type(b) ~= 'table' then
    return type(a) ~= 'table' and type(b) ~= 'table'
  end
  if #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

-- POST /ask (the rule of src/store/mem/asks.rs).
local function ask(aid, cid, text, choices, record)
  local S, v = session('k:' .. aid, 'ko', cid ~= '' and ('c:' .. cid) or 'ko')
  if not S then
    return gone('e404s')
  end
  local a = known_ask(S, v[7])
  if a then
    local stored = decoded(a.head .. '0}') or {}
    local sent_choices = nil
    if choices ~= '' then
      sent_choices = decoded(choices)
    end
    if stored.text ~= decoded(text) or not same_list(stored.choices, sent_choices) then
      return answer('e409k', S)
    end
    return answer('dup', S, str(a.q) .. '\n' .. str(a.expires))
  end
  if cid ~= '' and not v[9] then
    return answer('e404p', S)
  end
  -- The asks that expired are no longer open; those history dropped
  -- are forgotten. An ask of this id that is not known goes too.
  local old = v[7] and math.abs(tonumber(v[7])) or nil
  local open = {}
  local gone_fields = {}
  for _, o in ipairs(asks_of(v[8])) do
    if o[1] == old then
      o[2] = 0
    end
    if o[2] > now then
      open[#open + 1] = o
    elseif o[1] < S.n - limit then
      local rec = redis.call('HGET', s, str(o[1]))
      local id = rec and string.match(rec, '^K\n([^\n]*)\n')
      gone_fields[#gone_fields + 1] = str(o[1])
      if id and id ~= aid and math.abs(tonumber(redis.call('HGET', s, 'k:' .. id) or '0')) == o[1] then
        gone_fields[#gone_fields + 1] = 'k:' .. id
        gone_fields[#gone_fields + 1] = 'y:' .. id
      end
    end
  end
  if old and old < S.n - limit then
    gone_fields[#gone_fields + 1] = str(old)
  end
  if S.pc + #open >= max_pending then
    return answer('e503k', S)
  end
  local expires = tonumber(string.match(record, '^K\n[^\n]*\n(%d+)\n')) or 0
  local seq, fields = append(S, record)
  open[#open + 1] = { seq, expires }
  fields[5], fields[6] = 'k:' .. aid, fields[1]
  fields[7], fields[8] = 'ko', asks_str(open)
  S.la = fields[1]
  fields[#fields + 1], fields[#fields + 2] = 'la', S.la
  save(S, fields)
  -- What the log no longer knows of asks of this id, or of asks that
  -- expired below history.
  gone_fields[#gone_fields + 1] = 'y:' .. aid
  if #gone_fields > 0 then
    redis.call('HDEL', s, unpack(gone_fields))
  end
  return answer('ok', S)
end

-- POST /reply (the rule of src/store/mem/asks.rs): answered, expired,
-- choices, in this order.
local function reply(aid, text, record)
  local S, v = session('k:' .. aid, 'y:' .. aid, 'ko')
  if not S then
    return gone('e404s')
  end
  local a = known_ask(S, v[7])
  if not a then
    return answer('e404k', S)
  end
  if a.answered then
    local rq, rtext = string.match(v[8] or '', '^(%d+)\n(.*)$')
    if rtext and decoded(rtext) == decoded(text) then
      return answer('dup', S, rq)
    end
    return answer('e409r', S)
  end
  if a.expires <= now then
    return answer('e409e', S)
  end
  local stored = decoded(a.head .. '0}') or {}
  if type(stored.choices) == 'table' then
    local sent, found = decoded(text), false
    for _, c in ipairs(stored.choices) do
      if c == sent then
        found = true
      end
    end
    if not found then
      return answer('e400r', S)
    end
  end
  local open = {}
  for _, o in ipairs(asks_of(v[9])) do
    if o[1] ~= a.q then
      open[#open + 1] = o
    end
  end
  local seq, fields = append(S, record)
  fields[5], fields[6] = 'k:' .. aid, '-' .. str(a.q)
  fields[7], fields[8] = 'y:' .. aid, fields[1] .. '\n' .. text
  S.la = fields[1]
  fields[#fields + 1], fields[#fields + 2] = 'la', S.la
  fields[#fields + 1], fields[#fields + 2] = 'ko', asks_str(open)
  if a.q <= seq - limit then
    -- Out of history and now answered: the ask is forgotten.
    drops = drops or {}
    drops[#drops + 1], drops[#drops + 2] = str(a.q), 'k:' .. aid
    drops[#drops + 1] = 'y:' .. aid
  end
  save(S, fields)
  return answer('ok', S)
end

-- A bucket's new counter in a cluster: from the clock, as without
-- buckets (above every number handed out before while fewer than 15
-- prompts a millisecond arrive in a bucket), with the bucket's index as
-- its residue modulo 64. Its hash tag's slot lies in the index-th of 64
-- equal ranges (src/store/redis/slot.rs), so the index is the slot
-- (CRC16 of the tag) over 256.
local function clock_start()
  local tag = string.match(prefix, '{([^}]*)}$') or ''
  local crc = 0
  for i = 1, #tag do
    crc = bit.bxor(crc, bit.lshift(string.byte(tag, i), 8))
    for _ = 1, 8 do
      if bit.band(crc, 0x8000) ~= 0 then
        crc = bit.bxor(bit.lshift(crc, 1), 0x1021)
      else
        crc = bit.lshift(crc, 1)
      end
      crc = bit.band(crc, 0xffff)
    end
  end
  local t = tonumber(now_ms) * 1000
  return t - t % 64 + math.floor((crc % 16384) / 256)
end

-- The prompt `q` (its seq, as a string) of the session became pending:
-- it takes the next arrival number, enters the order of every pending
-- prompt, and is announced to the instances where an agent polls every
-- session.
local function arrive(q)
  local n
  if cluster then
    -- Each bucket's numbers step by 64 from its own residue (its index),
    -- so that no two buckets hand out one number: a cursor between two
    -- equal numbers would skip one of them.
    n = redis.call('INCRBY', arrived_key, 64)
    if n == 64 then
      n = clock_start()
      redis.call('SET', arrived_key, str(n))
    end
  else
    n = redis.call('INCR', arrived_key)
    if n == 1 then
      -- No counter (a new or flushed store): numbers go on from the
      -- clock, above every one handed out before (while fewer than a
      -- thousand prompts arrive per millisecond).
      n = tonumber(now_ms) * 1000
      redis.call('SET', arrived_key, str(n))
    end
  end
  local ns = str(n)
  redis.call('ZADD', pending_key, ns, sid .. '\n' .. q)
  publish(prefix .. 'arrivals', sid .. '\n' .. ns)
end

-- Removes `members` from the order of pending prompts, a thousand at a
-- time (Lua unpacks no more than about 8,000 arguments).
local function unorder(members)
  for i = 1, #members, 1000 do
    redis.call('ZREM', pending_key, unpack(members, i, math.min(i + 999, #members)))
  end
end

-- The pending prompts of the session `id` (key `sk`) leave the order:
-- its session is deleted. Only a session with pending prompts is read.
local function unlist(sk, id, pc)
  if (tonumber(pc) or 0) <= 0 then
    return
  end
  local kv = redis.call('HGETALL', sk)
  local members = {}
  for i = 1, #kv, 2 do
    if string.sub(kv[i], 1, 2) == 'c:' and (tonumber(kv[i + 1]) or 0) > 0 then
      members[#members + 1] = id .. '\n' .. kv[i + 1]
    end
  end
  unorder(members)
end

local function prompt(cid, record)
  -- The counters and the id's entry (dedupe) in one call.
  local ckey = 'c:' .. cid
  local S, v = session(ckey, 'ko')
  local extra = '0'
  if not S then
    S = create()
    if not S then
      return gone('e503s')
    end
    extra = '1'
  elseif v[7] then
    -- A resend repeats the text (compared decoded); another text under the
    -- same id is refused. A stored prompt that cannot be read back, or one
    -- only the id of is remembered, counts as a resend.
    local r = redis.call('HGET', s, str(math.abs(tonumber(v[7]) or 0)))
    local kind, data = nil, nil
    if r then
      kind, data = string.match(r, '^([pP])\n[^\n]*\n[^\n]*\n[^\n]*\n(.*)$')
    end
    if data then
      local ok_stored, stored = pcall(cjson.decode, json_of(kind, data))
      local sent_data = string.match(record, '^P\n[^\n]*\n[^\n]*\n[^\n]*\n(.*)$') or ''
      local ok_sent, sent = pcall(cjson.decode, sent_data .. '0}')
      if ok_stored and ok_sent and type(stored) == 'table' and type(sent) == 'table'
          and stored.prompt ~= sent.prompt then
        return answer('e409c', S, extra)
      end
    end
    return answer('dup', S, extra)
  end
  if S.pc >= max_pending or (v[8] and S.pc + open_asks(v[8]) >= max_pending) then
    return answer('e503p', S, extra)
  end
  local _, fields = append(S, record)
  S.pc = S.pc + 1
  fields[5], fields[6] = ckey, fields[1]
  fields[7], fields[8] = 'pc', str(S.pc)
  save(S, fields)
  arrive(wq)
  return answer('ok', S, extra)
end

-- Every answer below goes through here: what the call publishes is sent
-- once every write of it went through.
local function done(result)
  for i = 1, #published, 2 do
    redis.call(publish_command, published[i], published[i + 1])
  end
  return result
end

-- The op the call names, run on the session it names.
local function dispatch()
  if op == 'prompt' then
    return done(prompt(A[12], A[13]))
  elseif op == 'prompts' then
    local out = {}
    -- What the caller holds of a session once it applied the answers so
    -- far: a later prompt of that session is answered from there, not
    -- again from what it held before the call.
    local held = {}
    for i = 1, (#A - 11) / 6 do
      local a = 12 + 6 * (i - 1)
      s, sid = K[3 + i], A[a]
      known_epoch, known_next, new_epoch = A[a + 1], A[a + 2], A[a + 3]
      local h = held[sid]
      if h then
        known_epoch, known_next = h[1], h[2]
      end
      channel = prefix .. 'e:' .. sid
      wn, wq, wv = nil, nil, nil
      local r = prompt(A[a + 4], A[a + 5])
      if r[3] ~= '' then
        held[sid] = { r[3], r[4] }
      end
      out[i] = r
    end
    return done(out)
  elseif op == 'response' then
    local cid, aid, given, text, record = A[12], A[13], A[14], A[15], A[16]
    -- The counters, both ids' entries and the prompt's cancel in one call.
    local S, v = session('c:' .. cid, 'a:' .. aid, 'x:' .. cid)
    if not S then
      return done(gone('e404s'))
    end
    local pv, prev = v[7], v[8]
    if given == '1' and prev then
      local r = redis.call('HGET', s, prev) or ''
      local kind, pcid, data = string.match(r, '^([aA])\n([^\n]*)\n[^\n]*\n[^\n]*\n(.*)$')
      local sent_ok, sent = pcall(cjson.decode, text)
      if pcid == cid and sent_ok and data and text_of(json_of(kind, data)) == sent then
        return done(answer('dup', S))
      end
      return done(answer('e409', S))
    end
    if not pv then
      return done(answer('e404p', S))
    end
    if v[9] then
      return done(answer('e409x', S))
    end
    local seq, fields = append(S, record)
    fields[5], fields[6] = 'a:' .. aid, fields[1]
    S.la = fields[1]
    fields[7], fields[8] = 'la', S.la
    local pseq = tonumber(pv)
    if pseq > 0 then
      S.pc = S.pc - 1
      fields[9], fields[10] = 'pc', str(S.pc)
      if pseq <= seq - limit then
        -- Out of history and now answered: the prompt is forgotten.
        drops = drops or {}
        drops[#drops + 1], drops[#drops + 2] = pv, 'c:' .. cid
      else
        fields[11], fields[12] = 'c:' .. cid, '-' .. pv
      end
    end
    save(S, fields)
    if pseq > 0 then
      redis.call('ZREM', pending_key, sid .. '\n' .. pv)
    end
    -- The final answer replaces its draft.
    redis.call('HDEL', prefix .. 'd:' .. sid, aid)
    return done(answer('ok', S, watched()))
  elseif op == 'part' then
    -- A part of a streamed answer: appended to its draft and published
    -- (P sid epoch aid cid part literal); nothing else is stored.
    local cid, aid, lit, bytes = A[12], A[13], A[14], tonumber(A[15])
    local timeout, max_bytes = tonumber(A[16]), tonumber(A[17])
    local S, v = session('c:' .. cid, 'a:' .. aid, 'x:' .. cid)
    if not S then
      return done(gone('e404s'))
    end
    if v[8] then
      return done(answer('e409', S))
    end
    if not v[7] then
      return done(answer('e404p', S))
    end
    if v[9] then
      return done(answer('e409x', S))
    end
    local d = prefix .. 'd:' .. sid
    local cur = redis.call('HGET', d, aid)
    local parts, size, text = 0, 0, ''
    local live = false
    if cur then
      local dcid, dparts, dbytes, ddeadline, dtext = draft_of(cur)
      if ddeadline and ddeadline > now then
        if dcid ~= cid then
          return done(answer('e409', S))
        end
        live, parts, size, text = true, dparts, dbytes, dtext
      end
    end
    if not live then
      local open = 0
      local all = redis.call('HGETALL', d)
      for i = 2, #all, 2 do
        local _, _, _, ddeadline = draft_of(all[i])
        if ddeadline and ddeadline > now then
          open = open + 1
        end
      end
      if open >= max_pending then
        return done(answer('e503d', S))
      end
    end
    if size + bytes > max_bytes then
      return done(answer('e400t', S))
    end
    parts = parts + 1
    redis.call('HSET', d, aid, cid .. '\n' .. str(parts) .. '\n' .. str(size + bytes) .. '\n'
      .. str(now + timeout) .. '\n' .. text .. string.sub(lit, 2, -2))
    redis.call('PEXPIRE', d, timeout)
    publish(channel, 'P\n' .. sid .. '\n' .. S.e .. '\n' .. aid .. '\n' .. cid .. '\n' .. str(parts) .. '\n' .. lit)
    return done(answer('ok', S, watched()))
  elseif op == 'cancel' then
    -- A prompt stopped: a message of the log like an answer (the newest
    -- framed one), the prompt no longer pending, its drafts ended. A
    -- resend answers the stored cancel's seq as `extra`.
    local cid, record = A[12], A[13]
    local S, v = session('c:' .. cid, 'x:' .. cid)
    if not S then
      return done(gone('e404s'))
    end
    local pv, xv = v[7], v[8]
    if not pv then
      return done(answer('e404p', S))
    end
    if xv then
      return done(answer('dup', S, xv))
    end
    local pseq = tonumber(pv)
    if pseq < 0 then
      return done(answer('e409a', S))
    end
    local seq, fields = append(S, record)
    S.la = fields[1]
    S.pc = S.pc - 1
    fields[5], fields[6] = 'la', S.la
    fields[7], fields[8] = 'pc', str(S.pc)
    if pseq <= seq - limit then
      -- Out of history and now cancelled: the prompt is forgotten.
      drops = drops or {}
      drops[#drops + 1], drops[#drops + 2] = pv, 'c:' .. cid
    else
      fields[9], fields[10] = 'c:' .. cid, '-' .. pv
      fields[11], fields[12] = 'x:' .. cid, fields[1]
    end
    save(S, fields)
    redis.call('ZREM', pending_key, sid .. '\n' .. pv)
    local d = prefix .. 'd:' .. sid
    local kv = redis.call('HGETALL', d)
    for i = 1, #kv, 2 do
      if draft_of(kv[i + 1]) == cid then
        redis.call('HDEL', d, kv[i])
      end
    end
    return done(answer('ok', S, watched()))
  elseif op == 'ask' then
    return done(ask(A[12], A[13], A[14], A[15], A[16]))
  elseif op == 'reply' then
    return done(reply(A[12], A[13], A[14]))
  elseif op == 'agent' then
    -- This instance's agent state: online until A[13] (0: offline).
    local g = prefix .. 'g:' .. sid
    local inst, untl, seen = A[12], tonumber(A[13]), A[14]
    keep_until(g, inst, untl, str(untl) .. '\n' .. seen)
    publish(channel, 'A\n' .. sid .. '\n' .. inst .. '\n' .. str(untl) .. '\n' .. seen)
    return done({ 'ok', '' })
  elseif op == 'create' then
    local S = session()
    local extra = '0'
    if not S then
      S = create()
      if not S then
        return done(gone('e503s'))
      end
      extra = '1'
    else
      redis.call('ZADD', all, now, sid)
    end
    return done(answer('ok', S, extra))
  elseif op == 'delete' then
    local S = session()
    if not S then
      return done(gone('e404s'))
    end
    unlist(s, sid, S.pc)
    redis.call('DEL', s, w, prefix .. 'd:' .. sid, prefix .. 'g:' .. sid)
    redis.call('ZREM', all, sid)
    publish(channel, 'D\n' .. sid .. '\n' .. S.e)
    return done(gone('ok'))
  elseif op == 'sync' or op == 'renew' then
    local S = session()
    if not S then
      return done(gone('ok'))
    end
    -- `renew`, after a failover: the caller's copy held messages this
    -- master lacks (lost with the old one), whose seqs it would hand out
    -- again. A new epoch (keeping what is held) makes a client that saw
    -- them resync; the answer is the whole session.
    if op == 'renew' then
      -- The copy's newest message (seq, id, ts), where it has one: held
      -- here as a record naming that id and ts, or another message took
      -- its seq (written through an instance that held no copy).
      local lost = S.n < (tonumber(known_next) or 0)
      if not lost and A[12] and A[12] ~= '' then
        local r = redis.call('HGET', s, A[12])
        lost = not r or not string.find(r, '\n' .. A[13] .. '\n', 1, true)
          or not string.find(r, '\n' .. A[14] .. '\n', 1, true)
      end
      if S.e == known_epoch and lost then
        redis.call('HSET', s, 'e', new_epoch, 'pe', S.e)
        publish(channel, 'C\n' .. sid .. '\n' .. new_epoch)
        S.e = new_epoch
      end
      known_epoch = ''
    end
    -- After the records: the open drafts ("d\naid\n" and the draft) and
    -- the instances' agent states ("g\ninstance\n" and the state).
    local out = answer('ok', S, 'sync')
    local kv = redis.call('HGETALL', prefix .. 'd:' .. sid)
    for i = 1, #kv, 2 do
      out[#out + 1] = 'd\n' .. kv[i] .. '\n' .. kv[i + 1]
    end
    kv = redis.call('HGETALL', prefix .. 'g:' .. sid)
    for i = 1, #kv, 2 do
      out[#out + 1] = 'g\n' .. kv[i] .. '\n' .. kv[i + 1]
    end
    return done(out)
  elseif op == 'collect' then
    local ttl = tonumber(A[12])
    all = prefix .. 'sessions'
    local idle = redis.call('ZRANGEBYSCORE', all, '-inf', now - ttl, 'LIMIT', 0, 256)
    -- In a cluster the idle sessions' keys cannot be declared: they are
    -- all read before any is deleted (a slot migrating under the call
    -- stops it before it changed anything), only those that exist are
    -- deleted, and a session whose hash is missing (it may be moving to
    -- another master) is left alone.
    local found = {}
    for i, id in ipairs(idle) do
      local sk = prefix .. 's:' .. id
      local e, pc = unpack(redis.call('HMGET', sk, 'e', 'pc'))
      local keys = { sk, prefix .. 'w:' .. id, prefix .. 'd:' .. id, prefix .. 'g:' .. id }
      if cluster then
        local here = {}
        for _, k in ipairs(keys) do
          if redis.call('EXISTS', k) == 1 then
            here[#here + 1] = k
          end
        end
        keys = here
      end
      found[i] = { e, pc, keys }
    end
    local n = 0
    for i, id in ipairs(idle) do
      local e, pc, keys = unpack(found[i])
      if e or not cluster then
        unlist(prefix .. 's:' .. id, id, pc)
        if #keys > 0 then
          redis.call('DEL', unpack(keys))
        end
        redis.call('ZREM', all, id)
        n = n + 1
        if e then
          publish(prefix .. 'e:' .. id, 'D\n' .. id .. '\n' .. e)
        end
      end
    end
    return done({ 'ok', tostring(n) })
  elseif op == 'watch' then
    if A[13] == '0' then
      redis.call('HDEL', w, A[12])
    elseif redis.call('EXISTS', s) == 1 then
      redis.call('HSET', w, A[12], A[13])
    end
    return done({ 'ok', '' })
  elseif op == 'probe' then
    -- A growing write (refused while Redis refuses writes) that gives a
    -- store without a generation a new one.
    local key = prefix .. 'generation'
    local g = redis.call('GET', key) or new_epoch
    redis.call('SET', key, g)
    return done({ 'ok', g })
  elseif op == 'every' then
    -- The pending prompts of every session the scope covers (A[14]: '*'
    -- every session, 'p' those whose id starts with A[15], 's' the
    -- session A[15]) that arrived after A[12] ('' for all), oldest
    -- first, at most A[13]: {'ok', resume, then number, sid, seq, record
    -- for each}. An entry that names no pending prompt is dropped. At
    -- most `scan` entries are looked at, so a call stays short however
    -- many prompts of other sessions are pending: one that found nothing
    -- before that bound answers the last number it looked at as
    -- `resume` (else ''), and the caller reads on from there.
    --
    -- In a cluster the call reads one bucket, and the caller merges the
    -- buckets: {'ok', cut, floor, then the prompts}. The counter is first
    -- raised to at least A[16] (the highest number the caller knows), and
    -- `floor` is the counter then: every prompt that arrives in this
    -- bucket later takes a number above it. `cut` ('' when the listing is
    -- whole up to `floor`) is the number it is whole up to: the last one
    -- listed or looked at when it stopped early, or one less than an
    -- entry whose session is missing here (its slot may be migrating:
    -- the entry is neither listed nor dropped).
    local lim, kind, val = tonumber(A[13]), A[14], A[15]
    local from = A[12] == '' and '-inf' or ('(' .. A[12])
    local out, stale = { 'ok', '' }, {}
    local found, scan, last = 0, 10000, ''
    local floor, cut, ended = nil, nil, false
    if cluster then
      -- The counter c (the bucket's last number, or its start) is raised
      -- to the highest number at most A[16] of the bucket's residue: the
      -- next one, c + 64, is above A[16], and every number the bucket
      -- handed out or will hand out is at most c + 63 or above it.
      local c = redis.call('GET', arrived_key)
      local raised = c and tonumber(c) or clock_start()
      local h = tonumber(A[16]) or 0
      local r = raised % 64
      local top = h - h % 64 + r
      if top > h then
        top = top - 64
      end
      if top > raised then
        raised = top
      end
      if not c or raised > tonumber(c) then
        redis.call('SET', arrived_key, str(raised))
      end
      floor = raised + 63
      out[3] = str(floor)
      scan = 160
    end
    while found < lim and scan > 0 and not cut do
      local got = redis.call('ZRANGEBYSCORE', pending_key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 128)
      local whole = true
      for i = 1, #got, 2 do
        local id, q = string.match(got[i], '^(.*)\n(%d+)$')
        last, scan = got[i + 1], scan - 1
        from = '(' .. last
        if id and (kind == '*' or (kind == 'p' and string.sub(id, 1, #val) == val) or id == val) then
          local sk = prefix .. 's:' .. id
          local rec = redis.call('HGET', sk, q)
          local cid = rec and string.match(rec, '^[pP]\n([^\n]*)\n')
          if cid and redis.call('HGET', sk, 'c:' .. cid) == q then
            local n = #out
            out[n + 1], out[n + 2], out[n + 3], out[n + 4] = got[i + 1], id, q, rec
            found = found + 1
            if found >= lim then
              whole = i + 1 == #got
              break
            end
          elseif not rec and cluster and redis.call('EXISTS', sk) == 0 then
            cut, whole = tonumber(last) - 1, false
            break
          else
            stale[#stale + 1] = got[i]
          end
        elseif not id then
          stale[#stale + 1] = got[i]
        end
      end
      if #got < 256 and whole then
        ended = true
        break
      end
    end
    unorder(stale)
    if cluster then
      if not ended and not cut then
        cut = tonumber(last) or floor
      end
      out[2] = cut and str(cut) or ''
    elseif found == 0 and scan <= 0 then
      out[2] = last
    end
    return done(out)
  elseif op == 'everyagent' then
    -- This instance's agent of every session a scope covers (A[13]):
    -- online until A[14] (0: offline), last seen A[15], parked (A[16]
    -- '1') or in its grace.
    local key, field = prefix .. 'agents', A[12] .. '\n' .. A[13]
    keep_until(key, field, tonumber(A[14]), A[14] .. '\n' .. A[15] .. '\n' .. A[16])
    publish(prefix .. 'events', 'E\n' .. A[12] .. '\n' .. A[14] .. '\n' .. A[15] .. '\n' .. A[16] .. '\n' .. A[13])
    return done({ 'ok', '' })
  elseif op == 'touch' then
    all = prefix .. 'sessions'
    for i = 12, #A do
      redis.call('ZADD', all, 'XX', now, A[i])
    end
    return done({ 'ok', '' })
  end
  return redis.error_reply('relay: unknown op ' .. tostring(op))
end

-- Loaded as a library (Redis 7 and later), the relay's functions call
-- `run` (mod.rs replaces the line below with their registration), and
-- the helpers above are made once; called as a script (Redis 6.2),
-- every call runs the whole file.
local function run(keys, argv)
  begin(keys, argv)
  return dispatch()
end

return run(KEYS, ARGV)
