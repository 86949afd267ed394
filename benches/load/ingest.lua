-- wrk script for the ingest figure: POST a prompt with a unique client_msg_id
-- to one of SESSIONS sessions (round robin), each prompt 256 bytes.
--
--   TARGET=relay wrk -t1 -c64 -d10s -s benches/load/ingest.lua http://127.0.0.1:8000
--   TARGET=nchan wrk -t1 -c64 -d10s -s benches/load/ingest.lua http://127.0.0.1:8001
--
-- relay, base and nginx-static: POST /prompt with the JSON body (nginx-static
-- answers it with a static {"stored":true}); nchan: POST /pub/p/{sid} with the
-- same body (benches/load/nchan/nginx.conf). RUN_ID keeps ids of repeated runs
-- against one server apart (the relay dedupes by client_msg_id).

local target = os.getenv("TARGET") or "relay"
local sessions = tonumber(os.getenv("SESSIONS") or "1000")
local run_id = os.getenv("RUN_ID") or tostring(os.time())
local prompt = string.rep("x", 256)
local threads = 0

function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

local counter = 0
local headers = { ["Content-Type"] = "application/json" }

function request()
  counter = counter + 1
  local sid = "in" .. run_id .. "-" .. (counter % sessions)
  local body = '{"session_id":"' .. sid .. '","client_msg_id":"m' .. (thread_id or 0) .. "-" .. counter
    .. '","prompt":"' .. prompt .. '"}'
  local path = "/prompt"
  if target == "nchan" then
    path = "/pub/p/" .. sid
  end
  return wrk.format("POST", path, headers, body)
end
