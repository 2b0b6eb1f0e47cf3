"""The Proxmox VE API methods pvesim answers ("METHOD /path" as in apidata.js); extract_schema.py extracts these."""

from __future__ import annotations

SERVED_ENDPOINTS = [
    "POST /access/ticket",
    "GET /access/permissions",
    "GET /version",
    "GET /nodes",
    "GET /pools",
    "GET /cluster/resources",
    "GET /cluster/mapping/pci",
    "GET /nodes/{node}/hardware/pci",
    "GET /nodes/{node}/storage",
    "GET /nodes/{node}/qemu",
    "GET /nodes/{node}/lxc",
    "POST /nodes/{node}/qemu/{vmid}/clone",
    "GET /nodes/{node}/qemu/{vmid}/config",
    "PUT /nodes/{node}/qemu/{vmid}/config",
    "GET /nodes/{node}/qemu/{vmid}/pending",
    "GET /nodes/{node}/qemu/{vmid}/status/current",
    "POST /nodes/{node}/qemu/{vmid}/status/start",
    "POST /nodes/{node}/qemu/{vmid}/status/stop",
    "POST /nodes/{node}/qemu/{vmid}/status/shutdown",
    "GET /nodes/{node}/qemu/{vmid}/snapshot",
    "POST /nodes/{node}/qemu/{vmid}/snapshot",
    "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
    "GET /nodes/{node}/tasks/{upid}/status",
    "GET /nodes/{node}/tasks/{upid}/log",
]

SCHEMA_ENDPOINTS = SERVED_ENDPOINTS
