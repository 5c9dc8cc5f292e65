// The pause program of the dev cluster's real node: the sandbox container that holds each
// pod's namespaces (containerd's sandbox_image, imported as registry.k8s.io/pause:3.10).
// Like Kubernetes' own pause (build/pause/linux/pause.c), it sleeps until SIGINT or
// SIGTERM, then exits 0, and reaps every child re-parented to it (it is PID 1 of a pod
// that shares its process namespace). A static Go program, so no C toolchain is needed.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause.go (colocgrpo dev cluster)")
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
