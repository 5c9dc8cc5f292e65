// Reads a JSON list of PromQL expressions on stdin; prints, for each, the series selectors it reads
// (Prometheus' own parser), as JSON: [[{"name": ..., "type": "=", "value": ...}, ...], ...] per expression.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

type matcher struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

type result struct {
	Expr      string      `json:"expr"`
	Error     string      `json:"error,omitempty"`
	Selectors [][]matcher `json:"selectors"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "stdin must be a JSON list of strings:", err)
		os.Exit(2)
	}
	out := []result{}
	for _, text := range exprs {
		r := result{Expr: text, Selectors: [][]matcher{}}
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(text)
		if err != nil {
			r.Error = err.Error()
		} else {
			for _, selector := range parser.ExtractSelectors(expr) {
				ms := []matcher{}
				for _, m := range selector {
					ms = append(ms, matcher{Name: m.Name, Type: m.Type.String(), Value: m.Value})
				}
				r.Selectors = append(r.Selectors, ms)
			}
		}
		out = append(out, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
