module flowforge.local/tests/luahealth

go 1.24

require github.com/yuin/gopher-lua v1.1.1
