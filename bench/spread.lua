-- wrk script of bench/partitions.py: as post.lua, each request to the next of N partitions.
-- Usage: wrk -t1 -c64 -d10s -s bench/spread.lua http://host:port -- body.json N
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "post.lua")
local post_init = init
local requests, counter, parts = {}, 0, 1

function init(args)
  post_init(args)
  parts = tonumber(args[2])
  for p = 0, parts - 1 do
    requests[p] = wrk.format("POST", "/v1/partitions/" .. p .. "/records")
  end
end

function request()
  counter = counter + 1
  return requests[counter % parts]
end
