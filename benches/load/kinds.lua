-- wrk script for the cost of each kind of write over real sockets
-- (benches/load/kinds.sh): KIND=prompt posts 256-byte prompts m0-<n> to
-- SESSIONS sessions in turn, as ingest.lua does; KIND=cancel cancels those
-- prompts in the same order; KIND=ask posts 256-byte asks k<n> to the same
-- sessions; KIND=reply replies to those asks in order, 256 bytes each.
-- One wrk thread (-t1), so <n> counts the requests of one run and a cancel
-- or reply run names what the run before it stored; LIMIT (the count the
-- run before stored, less what may still be in flight) stops it before it
-- runs out. RUN_ID keeps the ids of runs against one server apart.
--
--   KIND=prompt RUN_ID=1 wrk -t1 -c64 -d4s -s benches/load/kinds.lua http://127.0.0.1:8000
--   KIND=cancel RUN_ID=1 wrk -t1 -c64 -d2s -s benches/load/kinds.lua http://127.0.0.1:8000

local kind = os.getenv("KIND") or "prompt"
local sessions = tonumber(os.getenv("SESSIONS") or "1000")
local run_id = os.getenv("RUN_ID") or tostring(os.time())
local text = string.rep("x", 256)
local headers = { ["Content-Type"] = "application/json" }
local limit = tonumber(os.getenv("LIMIT") or "0")
local counter = 0

function response()
  if limit > 0 and counter >= limit then
    wrk.thread:stop()
  end
end

function request()
  counter = counter + 1
  local sid = '"session_id":"k' .. run_id .. "-" .. (counter % sessions) .. '"'
  local path, body
  if kind == "prompt" then
    path = "/prompt"
    body = "{" .. sid .. ',"client_msg_id":"m0-' .. counter .. '","prompt":"' .. text .. '"}'
  elseif kind == "cancel" then
    path = "/cancel"
    body = "{" .. sid .. ',"client_msg_id":"m0-' .. counter .. '"}'
  elseif kind == "ask" or kind == "reply" then
    path = "/" .. kind
    body = "{" .. sid .. ',"ask_id":"k' .. counter .. '","text":"' .. text .. '"}'
  else
    error("KIND must be prompt, cancel, ask or reply")
  end
  return wrk.format("POST", path, headers, body)
end
