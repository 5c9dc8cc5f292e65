// node-probe: what a pod on the dev cluster's real node sees, as JSON on stdout, for tests/devcluster.
//
//	node-probe whoami               uid, gid, groups, capabilities, no_new_privs, seccomp, whether / is writable
//	node-probe resolve NAME...      each name's addresses through the pod's resolver (the cluster DNS)
//	node-probe apiserver            GET /version from the API server through the `kubernetes` Service, with
//	                                the pod's ServiceAccount token and CA
//	node-probe serve PORT           answer every TCP connection with this pod's hostname, until SIGTERM
//	node-probe dial HOST:PORT       connect, print what the other side says
//
// It exits 0 when the probe could be made (the JSON says what it found), 1 when it could not.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: node-probe whoami|resolve|apiserver|serve|dial ..."))
	}
	var out any
	var err error
	switch os.Args[1] {
	case "whoami":
		out, err = whoami()
	case "resolve":
		out, err = resolve(os.Args[2:])
	case "apiserver":
		out, err = apiserver()
	case "serve":
		err = serve(os.Args[2])
	case "dial":
		out, err = dial(os.Args[2])
	default:
		err = fmt.Errorf("unknown probe %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
	if out != nil {
		_ = json.NewEncoder(os.Stdout).Encode(out)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "node-probe:", err)
	os.Exit(1)
}

func statusFields() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if key, value, ok := strings.Cut(line, ":"); ok {
			fields[key] = strings.TrimSpace(value)
		}
	}
	return fields, nil
}

func whoami() (map[string]any, error) {
	status, err := statusFields()
	if err != nil {
		return nil, err
	}
	groups, err := os.Getgroups()
	if err != nil {
		return nil, err
	}
	probe, err := os.CreateTemp("/", "write-probe-")
	rootWritable := err == nil
	if rootWritable {
		probe.Close()
		os.Remove(probe.Name())
	}
	hostname, _ := os.Hostname()
	return map[string]any{
		"uid":           os.Getuid(),
		"gid":           os.Getgid(),
		"groups":        groups,
		"cap_eff":       status["CapEff"],
		"cap_bnd":       status["CapBnd"],
		"no_new_privs":  status["NoNewPrivs"],
		"seccomp":       status["Seccomp"],
		"root_writable": rootWritable,
		"hostname":      hostname,
	}, nil
}

func resolve(names []string) (map[string]any, error) {
	found := map[string]any{}
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addresses, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err != nil {
			found[name] = map[string]string{"error": err.Error()}
		} else {
			found[name] = addresses
		}
	}
	return found, nil
}

func apiserver() (map[string]any, error) {
	token, err := os.ReadFile(serviceAccount + "/token")
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(serviceAccount + "/ca.crt")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	client := &http.Client{
		Timeout:   15 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	request, err := http.NewRequest("GET", "https://"+host+"/version", nil)
	if err != nil {
		return nil, err
	}
	request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	response, err := client.Do(request)
	if err != nil {
		return nil, err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return nil, err
	}
	var version map[string]any
	_ = json.Unmarshal(body, &version)
	return map[string]any{"address": host, "status": response.StatusCode, "version": version}, nil
}

func serve(port string) error {
	listener, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	hostname, _ := os.Hostname()
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(conn, hostname)
			conn.Close()
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	return listener.Close()
}

func dial(address string) (map[string]any, error) {
	conn, err := net.DialTimeout("tcp", address, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, err := io.ReadAll(conn)
	if err != nil {
		return nil, err
	}
	return map[string]any{"address": address, "reply": strings.TrimSpace(string(reply))}, nil
}
