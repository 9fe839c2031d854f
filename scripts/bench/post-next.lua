-- wrk script: one POST /next per request (one ID each, no ?n= blocks); counts non-200s.
wrk.method = "POST"
local non200 = 0
function response(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end
