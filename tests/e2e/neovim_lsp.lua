-- Neovim's own LSP client against `rlc lsp`, headless: open the spec, wait for the diagnostics Neovim shows, fix one
-- line, wait for them to follow, and write both lists as JSON. Run by tests/e2e/test_neovim.py.
local spec, rlc, out = os.getenv("RLC_TEST_SPEC"), os.getenv("RLC_TEST_RLC"), os.getenv("RLC_TEST_OUT")
vim.cmd("edit " .. vim.fn.fnameescape(spec))
local client = vim.lsp.start_client({ name = "rlc", cmd = { rlc, "lsp" }, root_dir = vim.fn.fnamemodify(spec, ":h") })
vim.lsp.buf_attach_client(0, client)

local function shown()
  local list = {}
  for _, d in ipairs(vim.diagnostic.get(0)) do
    local lsp = d.user_data and d.user_data.lsp or {}
    table.insert(list, {
      line = d.lnum, col = d.col, end_col = d.end_col, severity = d.severity, message = d.message,
      source = d.source, code = d.code or lsp.code,
    })
  end
  return list
end

local opened = vim.wait(60000, function() return #vim.diagnostic.get(0) > 0 end, 20) and shown() or {}
local fix = tonumber(os.getenv("RLC_TEST_FIX_LINE"))
vim.api.nvim_buf_set_lines(0, fix, fix + 1, false, { os.getenv("RLC_TEST_FIX_TEXT") })
local before = #opened
vim.wait(60000, function() return #vim.diagnostic.get(0) < before end, 20)
vim.fn.writefile({ vim.fn.json_encode({ opened = opened, fixed = shown() }) }, out)
vim.lsp.stop_client(client)
vim.cmd("qall!")
