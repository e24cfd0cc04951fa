// Command luahealth runs an Argo CD resource customization script (a health check, an
// action's discovery.lua or action.lua) in gopher-lua, the Lua VM Argo CD embeds, once per
// object: it reads a JSON array of objects on stdin, sets each as the global `obj` and
// prints what the script returns, as one JSON line per object ({"error": ...} when the
// script fails). Like Argo CD's VM it opens only the package, base and table libraries and
// an os library of time and date, so a script that passes here uses nothing Argo CD lacks.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"

	lua "github.com/yuin/gopher-lua"
)

func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		table := l.NewTable()
		for _, item := range v {
			table.Append(toLua(l, item))
		}
		return table
	case map[string]any:
		table := l.NewTable()
		for key, item := range v {
			table.RawSetString(key, toLua(l, item))
		}
		return table
	}
	panic(fmt.Sprintf("unexpected JSON value %T", value))
}

func fromLua(value lua.LValue) any {
	switch v := value.(type) {
	case *lua.LNilType:
		return nil
	case lua.LBool:
		return bool(v)
	case lua.LNumber:
		if f := float64(v); f == math.Trunc(f) {
			return int64(f)
		}
		return float64(v)
	case lua.LString:
		return string(v)
	case *lua.LTable:
		if n := v.MaxN(); n > 0 {
			items := make([]any, 0, n)
			for i := 1; i <= n; i++ {
				items = append(items, fromLua(v.RawGetInt(i)))
			}
			return items
		}
		fields := map[string]any{}
		v.ForEach(func(key, item lua.LValue) { fields[key.String()] = fromLua(item) })
		return fields
	}
	return value.String()
}

// the os library Argo CD gives scripts: the clock, nothing of the process or the files
func openSafeOs(l *lua.LState) {
	l.Push(l.NewFunction(lua.OpenOs))
	l.Call(0, 0)
	full := l.GetGlobal(lua.OsLibName).(*lua.LTable)
	safe := l.NewTable()
	for _, name := range []string{"time", "date"} {
		safe.RawSetString(name, full.RawGetString(name))
	}
	l.SetGlobal(lua.OsLibName, safe)
}

func run(script string, obj any) (result any, err error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		l.Push(l.NewFunction(lib.open))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	openSafeOs(l)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	return fromLua(l.Get(-1)), nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: luahealth SCRIPT.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "luahealth:", err)
		os.Exit(2)
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "luahealth: reading stdin:", err)
		os.Exit(2)
	}
	var objects []any
	if err := json.Unmarshal(data, &objects); err != nil {
		fmt.Fprintln(os.Stderr, "luahealth: stdin is not a JSON array:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objects {
		result, err := run(string(script), obj)
		line := map[string]any{"result": result}
		if err != nil {
			line = map[string]any{"error": err.Error()}
		}
		if err := out.Encode(line); err != nil {
			fmt.Fprintln(os.Stderr, "luahealth: writing:", err)
			os.Exit(2)
		}
	}
}

