-- wrk script of bench/partitions.py: as post.lua, each request to the next of the partitions given.
-- Usage: wrk -t1 -c64 -d10s -s bench/spread.lua http://host:port -- body.json N
--   N: a count (partitions 0..N-1) or a comma-separated list of partitions ("0,3,6").
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "post.lua")
local post_init = init
local requests, counter, parts = {}, 0, 0

function init(args)
  post_init(args)
  local list = {}
  if string.find(args[2], ",") or tonumber(args[2]) == nil then
    for p in string.gmatch(args[2], "%d+") do list[#list + 1] = tonumber(p) end
  else
    for p = 0, tonumber(args[2]) - 1 do list[#list + 1] = p end
  end
  parts = #list
  for i, p in ipairs(list) do
    requests[i - 1] = wrk.format("POST", "/v1/partitions/" .. p .. "/records")
  end
end

function request()
  counter = counter + 1
  return requests[counter % parts]
end
