-- wrk script: every request registers a new, distinct device.
-- Usage: SECRET=... RUN=unique wrk -s scripts/wrk/register.lua URL
local counter = 0
local thread_id = 0
local next_id = 0
local secret, run

function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
end

function init(args)
  secret = os.getenv("SECRET")
  run = os.getenv("RUN") or tostring(os.time())
end

function request()
  counter = counter + 1
  local body = string.format('{"machine_id":"wrk-%s-%d-%d","device_type":"ICR-3241","model":"ICR-3241W","firmware":"6.3.5","serial":"S%d%d","enrollment_secret":"%s"}',
    run, thread_id, counter, thread_id, counter, secret)
  return wrk.format("POST", "/api/v1/register", {["Content-Type"] = "application/json"}, body)
end

-- Errors: wrk reports answers other than 2xx/3xx as "Non-2xx or 3xx responses".
