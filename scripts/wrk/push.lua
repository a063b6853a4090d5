-- wrk script: every request is a push of a distinct registered device.
-- Usage: TOKENS=tokens.txt wrk -s scripts/wrk/push.lua URL
local tokens = {}
local counter = 0
local thread_id = 0
local threads = 1
local body = '{"seq":%d,"config_version":0,"state":{"uptime":%d,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321,"rx_packets":9876,"tx_packets":8765},{"name":"eth1","rx_bytes":0,"tx_bytes":0},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789,"rx_packets":765432,"tx_packets":654321}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"8942031019123456789","imei":"356938035643809","apn":"internet"}}}'

local next_id = 0
function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
end

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do
    tokens[#tokens + 1] = line
  end
  threads = tonumber(os.getenv("WRK_THREADS") or "2")
end

function request()
  counter = counter + 1
  local i = ((counter * threads + thread_id) % #tokens) + 1
  return wrk.format("POST", "/api/v1/push",
    {["Authorization"] = "Bearer " .. tokens[i], ["Content-Type"] = "application/json"},
    string.format(body, counter + 1, counter))
end

-- Errors: wrk reports answers other than 2xx/3xx as "Non-2xx or 3xx responses".
