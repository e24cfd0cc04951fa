// Command kstatus reads Kubernetes objects as JSON on stdin (one object, a JSON array of
// them, or a List) and prints, one JSON line per object, the result of kstatus'
// status.Compute (sigs.k8s.io/cli-utils/pkg/kstatus/status): the judgement Flux, kpt and
// Helm's --wait make of it. FlowForge's tests run it over recorded and live objects.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Kind       string             `json:"kind"`
	Name       string             `json:"name"`
	Status     string             `json:"status"`
	Message    string             `json:"message"`
	Conditions []status.Condition `json:"conditions"`
	Error      string             `json:"error,omitempty"`
}

func objects(data []byte) ([]map[string]any, error) {
	var one any // whole numbers become int64, as the apiserver's clients decode them
	if err := utiljson.Unmarshal(data, &one); err != nil {
		return nil, err
	}
	switch value := one.(type) {
	case []any:
		out := make([]map[string]any, 0, len(value))
		for i, item := range value {
			obj, ok := item.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("item %d is not an object", i)
			}
			out = append(out, obj)
		}
		return out, nil
	case map[string]any:
		if items, ok := value["items"].([]any); ok && value["kind"] != nil {
			return objects(mustJSON(items))
		}
		return []map[string]any{value}, nil
	}
	return nil, fmt.Errorf("expected a JSON object or array")
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	objs, err := objects(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: stdin:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objs {
		u := &unstructured.Unstructured{Object: obj}
		v := verdict{Kind: u.GetKind(), Name: u.GetName()}
		result, err := status.Compute(u)
		if err != nil {
			v.Error = err.Error()
		} else {
			v.Status, v.Message, v.Conditions = string(result.Status), result.Message, result.Conditions
		}
		if err := out.Encode(v); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: writing:", err)
			os.Exit(2)
		}
	}
}
