#!/bin/bash
printf bbbbbbbb > /app/answer.txt
